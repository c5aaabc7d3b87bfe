//! The division of one GPU's time among the tenants with a compute share on it (issue 42): each tenant
//! has a request (its floor) and a limit (its cap), and is busy or idle. The rules, written once here
//! for the host's share wall in `vgpuctl monitor`, which computes them; the library's in-process share
//! (`libvgpu`'s `compute::lend`) converges on them from what it measures without calling this:
//!
//! - an idle tenant is entitled to nothing now: its request is lent to the busy ones (once busy, the next
//!   division gives it its floor back);
//! - the busy tenants share the GPU by weighted max-min (water-filling) with their requests as weights,
//!   each up to its limit: while the busy requests fit in 100 (admission keeps a GPU's requests within
//!   100), each gets at least its request, and the rest is shared in proportion to the requests;
//!   requests that add up past 100 (admission off) are scaled down alike;
//! - a busy tenant with no request (0) gets only what is left once every tenant with a request is at
//!   its limit, shared equally among such tenants, each up to its limit;
//! - so a tenant alone (the others idle) runs up to its limit, and the entitlements never add up past
//!   100.
//!
//! Pure: no I/O, no allocation ([`divide_into`]), no state. Who is busy is the caller's to decide, from
//! the driver's view (NVML's per-process samples), never from a tenant's own word. Not here: measuring,
//! enforcing (the wall's freezes: `vgpu_monitor::share_wall`), the settings a request and a limit come
//! from (`vgpu_ledger::settings::GpuSettings::request_limit`). Host-only (a tenant sees neither the
//! others' requests nor their limits), so it is not in the crate the interposer links.

pub use vgpu_ledger::envcompute::WHOLE;

/// One tenant of a GPU as the division sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tenant {
    /// Its floor, a percent of the GPU's time (0: none; it gets only leftovers). Above its limit, the
    /// limit is its request.
    pub request: u32,
    /// Its cap, a percent of the GPU's time (100, or more: none).
    pub limit: u32,
    /// It wants the GPU now (from the driver's view, never the tenant's word).
    pub busy: bool,
}

impl Tenant {
    /// Its limit and request as the division reads them: the limit at most the GPU, the request at most
    /// the limit.
    fn bounds(&self) -> (f64, f64) {
        let limit = self.limit.min(WHOLE);
        (f64::from(self.request.min(limit)), f64::from(limit))
    }
}

/// Each tenant's entitled share of the GPU, a percent of its time, into `out` (the same order as
/// `tenants`; `out` must be as long): 0 for an idle tenant, and for the busy ones their weighted max-min
/// share (the module's rules). The entitlements add up to at most 100. Allocates nothing, so the library
/// may call it on a launch's path.
///
/// # Panics
/// When `out` is not as long as `tenants`.
pub fn divide_into(tenants: &[Tenant], out: &mut [f64]) {
    assert_eq!(tenants.len(), out.len(), "one entitlement per tenant");
    // Unplaced busy tenants are NaN until water-filling places them.
    for (o, t) in out.iter_mut().zip(tenants) {
        *o = if t.busy && t.limit > 0 { f64::NAN } else { 0.0 };
    }
    let mut left = f64::from(WHOLE);
    // First the tenants with a request, weighted by it; then, with what is left (every one of them at
    // its limit), the tenants without one, equally.
    left = fill(tenants, out, left, |t| t.bounds().0);
    let _ = fill(tenants, out, left, |t| {
        if t.bounds().0 > 0.0 {
            0.0
        } else {
            1.0
        }
    });
}

/// [`divide_into`], into a new vector.
pub fn divide(tenants: &[Tenant]) -> Vec<f64> {
    let mut out = vec![0.0; tenants.len()];
    divide_into(tenants, &mut out);
    out
}

/// Water-filling of `left` percent among the unplaced tenants (NaN in `out`) whose `weight` is positive:
/// each gets `level × weight`, the level raised until the whole is given or every one is at its limit.
/// A tenant whose limit the level reaches is placed at its limit and the level rises for the others (it
/// can only rise: what the capped ones took is at most what the level gave them). Returns what is left.
fn fill(
    tenants: &[Tenant],
    out: &mut [f64],
    mut left: f64,
    weight: impl Fn(&Tenant) -> f64,
) -> f64 {
    let open = |o: &f64, t: &Tenant| o.is_nan() && weight(t) > 0.0;
    loop {
        let total: f64 = out
            .iter()
            .zip(tenants)
            .filter(|(o, t)| open(o, t))
            .map(|(_, t)| weight(t))
            .sum();
        if total <= 0.0 {
            return left;
        }
        let level = left.max(0.0) / total;
        let mut capped = false;
        for (o, t) in out.iter_mut().zip(tenants) {
            let limit = t.bounds().1;
            if open(o, t) && level * weight(t) >= limit {
                *o = limit;
                left -= limit;
                capped = true;
            }
        }
        if !capped {
            for (o, t) in out.iter_mut().zip(tenants) {
                if open(o, t) {
                    *o = level * weight(t);
                }
            }
            return 0.0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn t(request: u32, limit: u32, busy: bool) -> Tenant {
        Tenant {
            request,
            limit,
            busy,
        }
    }

    fn busy(request: u32, limit: u32) -> Tenant {
        t(request, limit, true)
    }

    fn idle(request: u32, limit: u32) -> Tenant {
        t(request, limit, false)
    }

    #[track_caller]
    fn assert_shares(tenants: &[Tenant], want: &[f64]) {
        let got = divide(tenants);
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(want) {
            assert!(
                (g - w).abs() < 1e-9,
                "{tenants:?}: got {got:?}, want {want:?}"
            );
        }
    }

    #[test]
    fn a_pair_both_busy_gets_its_requests() {
        assert_shares(&[busy(30, 100), busy(70, 100)], &[30.0, 70.0]);
        // A limit alone is a request as large (a hard cap): the same pair as caps.
        assert_shares(&[busy(30, 30), busy(70, 70)], &[30.0, 70.0]);
    }

    #[test]
    fn an_idle_tenant_lends_its_request_and_the_other_runs_to_its_limit() {
        assert_shares(&[busy(30, 100), idle(70, 100)], &[100.0, 0.0]);
        assert_shares(&[busy(30, 60), idle(70, 100)], &[60.0, 0.0]);
        assert_shares(&[idle(30, 60), busy(70, 80)], &[0.0, 80.0]);
        // A hard cap alone stays at its cap.
        assert_shares(&[busy(30, 30), idle(70, 70)], &[30.0, 0.0]);
        // Nobody busy: nobody entitled.
        assert_shares(&[idle(30, 100), idle(70, 100)], &[0.0, 0.0]);
        assert_shares(&[], &[]);
    }

    #[test]
    fn a_trio() {
        assert_shares(
            &[busy(20, 100), busy(30, 100), busy(50, 100)],
            &[20.0, 30.0, 50.0],
        );
        // One idle: its 50 is lent to the other two by their requests (20:30).
        assert_shares(
            &[busy(20, 100), busy(30, 100), idle(50, 100)],
            &[40.0, 60.0, 0.0],
        );
        // ... up to their limits; what one cannot take goes to the other.
        assert_shares(
            &[busy(20, 25), busy(30, 100), idle(50, 100)],
            &[25.0, 75.0, 0.0],
        );
        assert_shares(
            &[busy(20, 25), busy(30, 40), idle(50, 100)],
            &[25.0, 40.0, 0.0],
        );
    }

    #[test]
    fn limits_bind() {
        // 30 and 30 share the whole by weight (50 each) until the first's cap of 40.
        assert_shares(&[busy(30, 40), busy(30, 100)], &[40.0, 60.0]);
        // Every limit binds: the rest of the GPU stays idle.
        assert_shares(&[busy(10, 20), busy(10, 30)], &[20.0, 30.0]);
        // A limit of 0 gets nothing, busy or not.
        assert_shares(&[busy(0, 0), busy(50, 100)], &[0.0, 100.0]);
    }

    #[test]
    fn requests_under_100_share_the_leftover_by_weight() {
        assert_shares(&[busy(20, 100), busy(30, 100)], &[40.0, 60.0]);
        assert_shares(
            &[busy(10, 100), busy(10, 100), busy(20, 100)],
            &[25.0, 25.0, 50.0],
        );
        // Requests past 100 (admission off) are scaled down alike.
        assert_shares(&[busy(60, 60), busy(60, 60)], &[50.0, 50.0]);
        assert_shares(
            &[busy(100, 100), busy(50, 100)],
            &[100.0 * 2.0 / 3.0, 100.0 / 3.0],
        );
    }

    #[test]
    fn tenants_without_a_request_get_only_leftovers() {
        assert_shares(&[busy(0, 100), busy(50, 100)], &[0.0, 100.0]);
        assert_shares(&[busy(0, 100), busy(50, 60)], &[40.0, 60.0]);
        // Several share the leftover equally, up to their limits.
        assert_shares(
            &[busy(0, 100), busy(0, 10), busy(50, 60)],
            &[30.0, 10.0, 60.0],
        );
        // Alone, up to its limit.
        assert_shares(&[busy(0, 70), idle(50, 60)], &[70.0, 0.0]);
    }

    #[test]
    fn out_of_range_values_are_read_within_bounds() {
        // A request above the limit is the limit; a limit above 100 is 100.
        assert_shares(&[busy(90, 40), busy(60, 100)], &[40.0, 60.0]);
        assert_shares(&[busy(30, 250)], &[100.0]);
    }

    #[test]
    fn into_a_slice_without_allocating() {
        let mut out = [7.0; 3];
        divide_into(&[busy(30, 100), idle(20, 100), busy(50, 100)], &mut out);
        assert_eq!(out.map(|x| (x * 1e6).round() / 1e6), [37.5, 0.0, 62.5]);
    }

    fn tenant() -> impl Strategy<Value = Tenant> {
        (0u32..=100, 0u32..=100, any::<bool>()).prop_map(|(a, b, busy)| Tenant {
            request: a.min(b),
            limit: a.max(b),
            busy,
        })
    }

    /// Tenants whose requests add up to at most 100, as admission keeps them.
    fn admitted() -> impl Strategy<Value = Vec<Tenant>> {
        prop::collection::vec(tenant(), 0..8).prop_map(|mut ts| {
            let mut room = WHOLE;
            for t in &mut ts {
                t.request = t.request.min(room);
                room -= t.request;
            }
            ts
        })
    }

    proptest! {
        #[test]
        fn the_sum_is_at_most_the_gpu_and_each_busy_tenant_gets_its_floor(ts in admitted()) {
            let e = divide(&ts);
            let sum: f64 = e.iter().sum();
            prop_assert!(sum <= 100.0 + 1e-9, "{ts:?}: {e:?}");
            for (t, &x) in ts.iter().zip(&e) {
                prop_assert!(x >= 0.0 && x <= f64::from(t.limit) + 1e-9, "{ts:?}: {e:?}");
                if t.busy {
                    prop_assert!(x + 1e-9 >= f64::from(t.request.min(t.limit)), "{ts:?}: {e:?}");
                } else {
                    prop_assert_eq!(x, 0.0);
                }
            }
        }

        /// Work-conserving: the GPU is left idle only when every busy tenant is at its limit.
        #[test]
        fn nothing_is_left_idle_while_a_busy_tenant_is_below_its_limit(ts in prop::collection::vec(tenant(), 0..8)) {
            let e = divide(&ts);
            let sum: f64 = e.iter().sum();
            prop_assert!(sum <= 100.0 + 1e-9);
            let below = ts.iter().zip(&e).any(|(t, &x)| t.busy && x + 1e-9 < f64::from(t.limit));
            if below {
                prop_assert!((sum - 100.0).abs() < 1e-6, "{ts:?}: {e:?}");
            }
        }

        /// Among busy tenants with requests none at its limit, shares follow the requests.
        #[test]
        fn shares_follow_the_requests(ts in admitted()) {
            let e = divide(&ts);
            let free: Vec<(f64, f64)> = ts
                .iter()
                .zip(&e)
                .filter(|(t, &x)| t.busy && t.request > 0 && x + 1e-9 < f64::from(t.limit))
                .map(|(t, &x)| (f64::from(t.request), x))
                .collect();
            for w in free.windows(2) {
                prop_assert!((w[0].1 * w[1].0 - w[1].1 * w[0].0).abs() < 1e-6, "{ts:?}: {e:?}");
            }
        }
    }
}
