//! What keeps VMM memory alive besides its handle (`hooks/vmm`, `docs/libvgpu.md`, "What a handle keeps"):
//! a mapping's address range (`VmmMap`), the ranges of another process's allocation this process mapped or
//! bound (`Spans`, the union charged for an import), the tiles of a sparse array mapped onto a handle
//! (`TileKey`) and the memory bound to a multicast object (`McBind`). Data only; the policies are in
//! `hooks/vmm`.

/// One `cuMemMap`: `size` bytes of `handle` from its `offset`, at `ptr`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VmmMap {
    pub ptr: u64,
    pub handle: u64,
    pub size: u64,
    pub offset: u64,
}

/// The ranges `[start, end)` of an imported allocation charged to this process: those mapped or bound
/// (`done`, sorted, disjoint, merged) and those a map in flight charged (`pending`: its ticket, start,
/// end). What is charged is always the measure of their union, each byte once, whatever order maps of
/// overlapping windows start, succeed or fail in.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Spans {
    done: Vec<(u64, u64)>,
    pending: Vec<(u64, u64, u64)>,
}

/// `a` less every range of `cut` (both sorted or not; the result is sorted and disjoint).
fn subtract(a: &[(u64, u64)], cut: impl Iterator<Item = (u64, u64)> + Clone) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    for &(s, e) in a {
        let mut pieces = vec![(s, e)];
        for (cs, ce) in cut.clone() {
            pieces = pieces
                .into_iter()
                .flat_map(|(ps, pe)| {
                    let mut v = Vec::with_capacity(2);
                    if cs >= pe || ce <= ps {
                        v.push((ps, pe));
                    } else {
                        if ps < cs {
                            v.push((ps, cs));
                        }
                        if ce < pe {
                            v.push((ce, pe));
                        }
                    }
                    v
                })
                .collect();
        }
        out.extend(pieces);
    }
    out.sort_unstable();
    out
}

fn measure(v: &[(u64, u64)]) -> u64 {
    v.iter().map(|(s, e)| e - s).sum()
}

impl Spans {
    /// A map of `[start, end)` begins under `ticket`: what of it is not charged yet (neither mapped nor
    /// charged by another map in flight) is this map's to charge; the bytes.
    pub fn begin(&mut self, ticket: u64, start: u64, end: u64) -> u64 {
        let new = self.uncovered(&[(start, end.max(start))]);
        let bytes = measure(&new);
        self.pending
            .extend(new.into_iter().map(|(s, e)| (ticket, s, e)));
        bytes
    }

    /// The map under `ticket` succeeded: `[start, end)` is mapped. Returns what of it nobody holds
    /// charged any more (a map in flight that covered part of it failed meanwhile): to charge now.
    pub fn commit(&mut self, ticket: u64, start: u64, end: u64) -> u64 {
        let extra = measure(&self.uncovered(&[(start, end.max(start))]));
        self.pending.retain(|p| p.0 != ticket);
        self.done.push((start, end.max(start)));
        self.done.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(self.done.len());
        for &(s, e) in &self.done {
            match merged.last_mut() {
                Some(last) if s <= last.1 => last.1 = last.1.max(e),
                _ if s < e => merged.push((s, e)),
                _ => {}
            }
        }
        self.done = merged;
        extra
    }

    /// The map under `ticket` did not happen: its ranges are given up. Returns (bytes no mapping
    /// covers: to give back, bytes a mapping made meanwhile covers: to stay charged).
    pub fn abort(&mut self, ticket: u64) -> (u64, u64) {
        let mine: Vec<(u64, u64)> = self
            .pending
            .iter()
            .filter(|p| p.0 == ticket)
            .map(|p| (p.1, p.2))
            .collect();
        self.pending.retain(|p| p.0 != ticket);
        let free = measure(&subtract(&mine, self.done.iter().copied()));
        (free, measure(&mine) - free)
    }

    /// The bytes charged: the union of what is mapped and what maps in flight charged.
    #[cfg(test)]
    pub fn charged(&self) -> u64 {
        let pending: Vec<(u64, u64)> = self.pending.iter().map(|p| (p.1, p.2)).collect();
        measure(&self.done) + measure(&subtract(&pending, self.done.iter().copied()))
    }

    fn uncovered(&self, r: &[(u64, u64)]) -> Vec<(u64, u64)> {
        let rest = subtract(r, self.done.iter().copied());
        subtract(&rest, self.pending.iter().map(|p| (p.1, p.2)))
    }
}

/// One tile region of a sparse array (`CUarrayMapInfo`'s subresource): its type and the fields that
/// name it (a sparse level's level, layer, offsets and extents; a mip tail's layer, offset and size).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TileKey {
    pub subresource: u32,
    pub fields: [u64; 4],
}

/// One `cuMulticastBindMem` / `cuMulticastBindAddr`: `handle`'s memory (on device `dev`) bound at the
/// multicast object's `mc_offset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct McBind {
    pub mc_offset: u64,
    pub dev: i32,
    pub handle: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_are_charged_by_their_union() {
        let mut s = Spans::default();
        let mut charged = 0;
        for i in 0..8 {
            let t = i + 1;
            charged += s.begin(t, i * 2, i * 2 + 2);
            charged += s.commit(t, i * 2, i * 2 + 2);
        }
        assert_eq!(charged, 16, "eight 2-byte windows at every offset: 16");
        assert_eq!(s.charged(), 16);
        assert_eq!(s.done, vec![(0, 16)], "merged");
        assert_eq!(s.begin(9, 4, 12), 0, "mapped again: nothing more");
        assert_eq!(s.commit(9, 4, 12), 0);
        assert_eq!(s.begin(10, 12, 20), 4, "half new");
    }

    #[test]
    fn overlapping_maps_in_flight_charge_each_byte_once_whichever_fails() {
        // A fails, B succeeds: what A charged under B's range stays (B did not charge it).
        let mut s = Spans::default();
        assert_eq!(s.begin(1, 0, 10), 10);
        assert_eq!(s.begin(2, 5, 15), 5);
        assert_eq!(s.commit(2, 5, 15), 0);
        assert_eq!(s.abort(1), (5, 5), "0..5 back, 5..10 stays for B's mapping");
        assert_eq!(s.charged(), 10);
        // A fails before B succeeds: B's commit charges what A gave back.
        let mut s = Spans::default();
        assert_eq!(s.begin(1, 0, 10), 10);
        assert_eq!(s.begin(2, 5, 15), 5);
        assert_eq!(s.abort(1), (10, 0));
        assert_eq!(s.commit(2, 5, 15), 5, "5..10 charged after the fact");
        assert_eq!(s.charged(), 10);
        // Both succeed: 15 bytes in all.
        let mut s = Spans::default();
        let a = s.begin(1, 0, 10) + s.begin(2, 5, 15);
        let b = s.commit(1, 0, 10) + s.commit(2, 5, 15);
        assert_eq!((a + b, s.charged()), (15, 15));
    }

    #[test]
    fn empty_and_reversed_ranges_charge_nothing() {
        let mut s = Spans::default();
        assert_eq!(s.begin(1, 10, 10), 0);
        assert_eq!(s.commit(1, 10, 10), 0);
        assert_eq!(s.begin(2, 10, 5), 0);
        assert_eq!(s.abort(2), (0, 0));
        assert_eq!(s.charged(), 0);
    }
}
