//! `GetPreferredAllocation`'s choice: which of the free IDs one container should get. The kubelet asks
//! before each allocation, and the plugin answers with IDs of one GPU: the one that fits the request with
//! the fewest free IDs left (best fit, so large holes stay for large requests). When no single GPU has
//! that many free, it can only answer IDs of several; the kubelet then allocates them and `Allocate`
//! refuses the container (`crate::allocate`), as a quota cannot span GPUs. Not here: the refusal itself.

use crate::devices::uuid_of;

/// The IDs to prefer among `available` for a container asking `size`, with `must_include` (IDs the
/// kubelet already holds for the container, e.g. from an init container) first.
pub fn preferred(available: &[String], must_include: &[String], size: usize) -> Vec<String> {
    // The free IDs grouped by GPU, in the order the kubelet listed them.
    let mut groups: Vec<(&str, Vec<&String>)> = Vec::new();
    for id in available.iter().filter(|id| !must_include.contains(id)) {
        let uuid = uuid_of(id).unwrap_or(id);
        match groups.iter_mut().find(|(u, _)| *u == uuid) {
            Some((_, ids)) => ids.push(id),
            None => groups.push((uuid, vec![id])),
        }
    }
    let mut out: Vec<String> = must_include.to_vec();
    let needed = size.saturating_sub(out.len());
    // With IDs already held, their GPU first; else the best fit; else the largest GPUs first.
    let held: Option<&str> = must_include.first().and_then(|id| uuid_of(id));
    groups.sort_by_key(|(uuid, ids)| {
        let mine = held == Some(*uuid);
        let fits = ids.len() >= needed;
        (
            !mine,
            !fits,
            if fits {
                ids.len()
            } else {
                usize::MAX - ids.len()
            },
        )
    });
    out.extend(
        groups
            .into_iter()
            .flat_map(|(_, ids)| ids)
            .take(needed)
            .cloned(),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::device_id;

    fn ids(uuid: &str, range: std::ops::Range<u64>) -> Vec<String> {
        range.map(|n| device_id(uuid, n)).collect()
    }

    fn gpus_of(chosen: &[String]) -> Vec<&str> {
        let mut g: Vec<&str> = chosen.iter().filter_map(|id| uuid_of(id)).collect();
        g.dedup();
        g
    }

    #[test]
    fn the_best_fitting_gpu_alone() {
        // GPU-a has 10 free, GPU-b 5: 4 go on GPU-b, leaving GPU-a's 10 for a larger request.
        let free = [ids("GPU-a", 0..10), ids("GPU-b", 3..8)].concat();
        let p = preferred(&free, &[], 4);
        assert_eq!(p, ids("GPU-b", 3..7));
        // 6 fit only on GPU-a.
        let p = preferred(&free, &[], 6);
        assert_eq!(p.len(), 6);
        assert_eq!(gpus_of(&p), ["GPU-a"]);
    }

    #[test]
    fn ids_already_held_keep_their_gpu() {
        let free = [ids("GPU-a", 0..10), ids("GPU-b", 0..10)].concat();
        let must = ids("GPU-b", 0..2);
        let p = preferred(&free, &must, 5);
        assert_eq!(p, ids("GPU-b", 0..5));
    }

    #[test]
    fn no_gpu_fits_the_largest_first_and_allocate_refuses() {
        let free = [ids("GPU-a", 0..3), ids("GPU-b", 0..5)].concat();
        let p = preferred(&free, &[], 7);
        assert_eq!(p.len(), 7);
        assert_eq!(gpus_of(&p), ["GPU-b", "GPU-a"]);
    }
}
