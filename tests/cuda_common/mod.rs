//! Test data shared by the kernel tests (emulated on the CPU and on a GPU):
//! inputs with outliers and special values, slot mappings with negative
//! slots, and the host store as the reference.
#![allow(dead_code)] // each test binary uses its own subset

use half::{bf16, f16};
use mla_cache::codec::{ElemType, Values};
use mla_cache::store::{HostStore, MatrixDesc};
use mla_cache::{BlockId, CacheConfig, Dtype};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

/// Token counts every kernel test covers.
pub const TOKEN_COUNTS: [usize; 5] = [1, 3, 63, 65, 1000];

/// Token counts of the CPU emulation (slower than a GPU by far).
pub const EMULATED_TOKEN_COUNTS: [usize; 5] = [1, 3, 63, 65, 130];

/// Byte the destination buffers start with, to detect writes.
pub const FILL: u8 = 0xA5;

/// A tensor of one element type, as host memory.
#[derive(Debug, Clone)]
pub enum Data {
    /// bf16 values.
    Bf16(Vec<bf16>),
    /// f16 values.
    F16(Vec<f16>),
    /// f32 values.
    F32(Vec<f32>),
}

impl Data {
    /// The values for the host store.
    pub fn values(&self) -> Values<'_> {
        match self {
            Data::Bf16(v) => Values::Bf16(v),
            Data::F16(v) => Values::F16(v),
            Data::F32(v) => Values::F32(v),
        }
    }

    /// The element type.
    pub fn elem(&self) -> ElemType {
        self.values().elem_type()
    }

    /// The raw bytes.
    pub fn bytes(&self) -> &[u8] {
        let (ptr, len) = match self {
            Data::Bf16(v) => (v.as_ptr().cast::<u8>(), v.len() * 2),
            Data::F16(v) => (v.as_ptr().cast::<u8>(), v.len() * 2),
            Data::F32(v) => (v.as_ptr().cast::<u8>(), v.len() * 4),
        };
        // SAFETY: plain-old-data values viewed as bytes.
        unsafe { std::slice::from_raw_parts(ptr, len) }
    }

    /// A `[rows, cols]` contiguous descriptor of these values at `addr`.
    pub fn desc_at(&self, addr: usize, rows: usize, cols: usize) -> MatrixDesc {
        MatrixDesc::contiguous(addr, self.elem(), rows, cols)
    }
}

/// `n` f32 values: Gaussian with a few large channels, plus (when `special`)
/// NaN, infinities, zeros of both signs, subnormals, exact rounding ties and
/// whole groups of zeros or tiny values.
pub fn sample_f32(rng: &mut StdRng, n: usize, special: bool) -> Vec<f32> {
    let mut v: Vec<f32> = (0..n)
        .map(|i| {
            // Box-Muller.
            let (u1, u2): (f32, f32) = (rng.gen_range(1e-7..1.0), rng.gen());
            let g = (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos();
            let channel_scale = if i % 97 == 5 { 40.0 } else { 1.0 };
            g * channel_scale
        })
        .collect();
    if special && n >= 64 {
        let specials = [
            f32::NAN,
            -f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            0.0,
            -0.0,
            1e-40,
            -3e-39,
            448.0 * 1.5,
            7.5 * 0.25,
            1.0 + 1.0 / 16.0, // a tie for 3 mantissa bits
            -(1.0 + 3.0 / 16.0),
            65504.0,
            -1e4,
        ];
        for s in specials {
            let i = rng.gen_range(0..n);
            v[i] = s;
        }
        // A group of 32 tiny values and one of zeros.
        let g = rng.gen_range(0..n / 32) * 32;
        for x in &mut v[g..g + 32] {
            *x = rng.gen_range(-1e-38f32..1e-38);
        }
        let g = rng.gen_range(0..n / 32) * 32;
        v[g..g + 32].fill(0.0);
    }
    v
}

/// `n` values of `elem` from [`sample_f32`].
pub fn sample(rng: &mut StdRng, elem: ElemType, n: usize, special: bool) -> Data {
    let v = sample_f32(rng, n, special);
    match elem {
        ElemType::Bf16 => Data::Bf16(v.iter().map(|&x| bf16::from_f32(x)).collect()),
        ElemType::F16 => Data::F16(v.iter().map(|&x| f16::from_f32(x)).collect()),
        ElemType::F32 => Data::F32(v),
    }
}

/// A config for `tokens` tokens with room to spare: 2 layers of 64-token
/// blocks.
pub fn config(dtype: Dtype, tokens: usize) -> CacheConfig {
    let mut c = CacheConfig::new(tokens.div_ceil(64) * 2 + 1);
    c.dtype = dtype;
    c.num_layers = 2;
    c
}

/// Distinct slots in random order, about one token in eight skipped (-1).
pub fn slot_mapping(rng: &mut StdRng, tokens: usize, num_slots: usize) -> Vec<i64> {
    let mut slots: Vec<i64> = (0..num_slots as i64).collect();
    slots.shuffle(rng);
    slots.truncate(tokens);
    for s in &mut slots {
        if rng.gen_ratio(1, 8) {
            *s = -1;
        }
    }
    if tokens > 1 {
        slots[tokens / 2] = -7;
    }
    slots
}

/// A block table: the blocks in random order.
pub fn block_table(rng: &mut StdRng, num_blocks: usize) -> Vec<BlockId> {
    let mut t: Vec<BlockId> = (0..num_blocks as BlockId).collect();
    t.shuffle(rng);
    t
}

/// A seeded generator.
pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

/// The bytes of `layer` of a host store.
pub fn layer_bytes(store: &HostStore, layer: usize) -> Vec<u8> {
    store.with_layer_bytes(layer, |b| b.to_vec()).unwrap()
}

/// Checks a device-written layer against the host store's: written slots
/// equal, every other byte still [`FILL`].
pub fn check_layer(what: &str, got: &[u8], host: &[u8], slots: &[i64], bpt: usize) {
    assert_eq!(got.len(), host.len(), "{what}: layer size");
    let mut written = vec![false; got.len() / bpt];
    for &s in slots {
        if s >= 0 {
            written[s as usize] = true;
        }
    }
    for (slot, w) in written.iter().enumerate() {
        let range = slot * bpt..(slot + 1) * bpt;
        if *w {
            if got[range.clone()] != host[range.clone()] {
                let t = slots.iter().position(|&s| s == slot as i64).unwrap();
                let first = (0..bpt)
                    .find(|&i| got[range.start + i] != host[range.start + i])
                    .unwrap();
                panic!(
                    "{what}: token {t} (slot {slot}) differs from the CPU codec at byte {first}: \
                     got {:#04x}, expected {:#04x}",
                    got[range.start + first],
                    host[range.start + first]
                );
            }
        } else {
            assert!(
                got[range].iter().all(|&b| b == FILL),
                "{what}: slot {slot} was not written but changed"
            );
        }
    }
}

/// Compares decoded values bit for bit (f32 or bf16 as raw bytes).
pub fn check_decoded(what: &str, got: &[u8], expected: &[u8], elem_size: usize, width: usize) {
    assert_eq!(got.len(), expected.len(), "{what}: length");
    if let Some(i) = (0..got.len()).find(|&i| got[i] != expected[i]) {
        let e = i / elem_size;
        panic!(
            "{what}: value {e} (token {}, element {}) differs from the CPU decoder: got {:02x?}, expected {:02x?}",
            e / width,
            e % width,
            &got[e * elem_size..(e + 1) * elem_size],
            &expected[e * elem_size..(e + 1) * elem_size]
        );
    }
}
