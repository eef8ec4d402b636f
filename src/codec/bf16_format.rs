//! `bf16`: the NoPE part stored as 2 bytes per value, little endian.

use super::element::{Decoded, Element};

/// Writes `c_kv` as bf16 into `dst` (`2 * c_kv.len()` bytes).
pub(super) fn encode_nope<T: Element>(c_kv: &[T], dst: &mut [u8]) {
    T::write_bf16(c_kv, dst);
}

/// Reads `out.len()` bf16 values from `src`.
pub(super) fn decode_nope<O: Decoded>(src: &[u8], out: &mut [O]) {
    decode_bf16_run(src, out);
}

/// Reads little-endian bf16 values (also the RoPE part of every format).
pub(super) fn decode_bf16_run<O: Decoded>(src: &[u8], out: &mut [O]) {
    for (o, pair) in out.iter_mut().zip(src.chunks_exact(2)) {
        *o = O::from_bf16_bits(u16::from_le_bytes([pair[0], pair[1]]));
    }
}
