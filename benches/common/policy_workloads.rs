//! The eviction policies' cost workloads, shared by the criterion benches
//! (`benches/manager.rs`) and the paired comparison
//! (`examples/policy_cost.rs`): prompts that are one of 64 shared prefixes
//! followed by a fresh tail, served by a 16,384-block cache that every
//! request overflows once it is full.

use std::time::Duration;

use mla_cache::{BlockManager, CacheConfig, EvictionPolicyKind};

/// One workload: prompt length and shared prefix length, in tokens.
pub struct Workload {
    pub name: &'static str,
    pub len: u32,
    pub shared: u32,
}

/// 4,096-token prompts, 2,048 of them shared (criterion's `manager_policy`).
pub const POLICY: Workload = Workload {
    name: "policy",
    len: 4096,
    shared: 2048,
};

/// 12,000-token prompts, 4,096 of them shared (`manager_long_prompt`).
pub const LONG_PROMPT: Workload = Workload {
    name: "long_prompt",
    len: 12_000,
    shared: 4096,
};

impl Workload {
    /// Writes the `i`-th prompt into `out`: one of 64 shared prefixes and a
    /// fresh tail.
    pub fn write_prompt(&self, i: u32, out: &mut Vec<u32>) {
        let prefix = i.wrapping_mul(2_654_435_761) % 64;
        out.clear();
        out.extend((0..self.len).map(|j| match j < self.shared {
            true => prefix * self.shared + j,
            false => (1 << 30) + i.wrapping_mul(self.len) + j,
        }));
    }

    /// The `i`-th prompt.
    pub fn prompt(&self, i: u32) -> Vec<u32> {
        let mut p = Vec::new();
        self.write_prompt(i, &mut p);
        p
    }
}

/// The workloads' cache under `kind`.
pub fn manager(kind: EvictionPolicyKind) -> BlockManager {
    let mut config = CacheConfig::new(16_384);
    config.hash_seed = Some(1);
    config.eviction = kind;
    BlockManager::new(config).expect("a 16,384-block cache")
}

/// The calling thread's CPU time.
pub fn thread_cpu_time() -> Duration {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec to write; the clock id is a constant.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    assert_eq!(rc, 0, "clock_gettime");
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}
