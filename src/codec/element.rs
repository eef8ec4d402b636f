//! Element types the encoders read ([`ElemType`], [`Element`], [`Values`])
//! and the decoders write ([`Decoded`]).

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use super::minifloat::bf16_bits_from_f32;

/// Element type of an input or output tensor.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    strum::IntoStaticStr,
    strum::EnumCount,
    strum::VariantArray,
)]
#[strum(serialize_all = "snake_case")]
#[repr(C)]
pub enum ElemType {
    /// bfloat16.
    Bf16 = 0,
    /// IEEE binary16.
    F16 = 1,
    /// IEEE binary32.
    F32 = 2,
}

impl ElemType {
    /// Every element type, in declaration order: strum's `VARIANTS` as an
    /// array.
    pub const ALL: [ElemType; <ElemType as strum::EnumCount>::COUNT] =
        *<Self as strum::VariantArray>::VARIANTS
            .first_chunk()
            .expect("strum lists COUNT variants");

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            ElemType::Bf16 | ElemType::F16 => 2,
            ElemType::F32 => 4,
        }
    }

    /// Lower-case name (`bf16`, `f16`, `f32`).
    pub fn name(self) -> &'static str {
        self.into()
    }
}

impl std::fmt::Display for ElemType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for half::bf16 {}
    impl Sealed for half::f16 {}
    impl Sealed for f32 {}
}

/// A float type the encoders accept: `bf16`, `f16` or `f32`.
pub trait Element: sealed::Sealed + Copy + Send + Sync + 'static {
    /// The matching [`ElemType`].
    const TYPE: ElemType;

    /// Widens `src` to f32 (always exact) into `dst`, which has the same length.
    fn widen(src: &[Self], dst: &mut [f32]);

    /// Writes `src` as little-endian bf16 into `dst` (`2 * src.len()` bytes):
    /// verbatim for bf16, rounded to nearest even otherwise, any NaN becoming
    /// `0x7FFF`.
    fn write_bf16(src: &[Self], dst: &mut [u8]);
}

/// Elements widened per step when rounding to bf16 goes through f32.
const WIDEN_TILE: usize = 64;

fn write_bf16_via_f32<T: Element>(src: &[T], dst: &mut [u8]) {
    let mut wide = [0f32; WIDEN_TILE];
    for (s, d) in src.chunks(WIDEN_TILE).zip(dst.chunks_mut(2 * WIDEN_TILE)) {
        let wide = &mut wide[..s.len()];
        T::widen(s, wide);
        write_rounded_bf16(wide, d);
    }
}

impl Element for bf16 {
    const TYPE: ElemType = ElemType::Bf16;

    fn widen(src: &[Self], dst: &mut [f32]) {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = f32::from_bits(u32::from(s.to_bits()) << 16);
        }
    }

    fn write_bf16(src: &[Self], dst: &mut [u8]) {
        for (pair, s) in dst.chunks_exact_mut(2).zip(src) {
            pair.copy_from_slice(&s.to_bits().to_le_bytes());
        }
    }
}

impl Element for f16 {
    const TYPE: ElemType = ElemType::F16;

    fn widen(src: &[Self], dst: &mut [f32]) {
        src.convert_to_f32_slice(dst);
    }

    fn write_bf16(src: &[Self], dst: &mut [u8]) {
        write_bf16_via_f32(src, dst);
    }
}

impl Element for f32 {
    const TYPE: ElemType = ElemType::F32;

    fn widen(src: &[Self], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }

    fn write_bf16(src: &[Self], dst: &mut [u8]) {
        write_rounded_bf16(src, dst);
    }
}

/// Rounds f32 values to little-endian bf16, in fixed-size tiles so that the
/// loop vectorizes.
fn write_rounded_bf16(src: &[f32], dst: &mut [u8]) {
    const TILE: usize = 16;
    let mut src_tiles = src.chunks_exact(TILE);
    let mut dst_tiles = dst.chunks_exact_mut(2 * TILE);
    for (s, d) in (&mut src_tiles).zip(&mut dst_tiles) {
        if let (Ok(s), Ok(d)) = (
            <&[f32; TILE]>::try_from(s),
            <&mut [u8; 2 * TILE]>::try_from(d),
        ) {
            for i in 0..TILE {
                let b = bf16_bits_from_f32(s[i]);
                d[2 * i] = b as u8;
                d[2 * i + 1] = (b >> 8) as u8;
            }
        }
    }
    for (pair, &v) in dst_tiles
        .into_remainder()
        .chunks_exact_mut(2)
        .zip(src_tiles.remainder())
    {
        pair.copy_from_slice(&bf16_bits_from_f32(v).to_le_bytes());
    }
}

/// A borrowed run of input values of any [`ElemType`] (one row, or `T` rows
/// back to back).
#[derive(Debug, Clone, Copy)]
pub enum Values<'a> {
    /// bf16 values.
    Bf16(&'a [bf16]),
    /// f16 values.
    F16(&'a [f16]),
    /// f32 values.
    F32(&'a [f32]),
}

impl<'a> Values<'a> {
    /// The element type.
    pub fn elem_type(&self) -> ElemType {
        match self {
            Values::Bf16(_) => ElemType::Bf16,
            Values::F16(_) => ElemType::F16,
            Values::F32(_) => ElemType::F32,
        }
    }

    /// Number of values.
    pub fn len(&self) -> usize {
        match self {
            Values::Bf16(s) => s.len(),
            Values::F16(s) => s.len(),
            Values::F32(s) => s.len(),
        }
    }

    /// Whether there are no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Values `start..start + len`, or `None` if that range is out of bounds.
    pub fn window(&self, start: usize, len: usize) -> Option<Values<'a>> {
        let end = start.checked_add(len)?;
        Some(match *self {
            Values::Bf16(s) => Values::Bf16(s.get(start..end)?),
            Values::F16(s) => Values::F16(s.get(start..end)?),
            Values::F32(s) => Values::F32(s.get(start..end)?),
        })
    }

    /// Views `len` values of type `elem` starting at `ptr`.
    ///
    /// # Safety
    /// `ptr` must be non-null, aligned for `elem`, and valid for reads of
    /// `len` elements that nobody writes for the lifetime `'a`.
    pub(crate) unsafe fn from_raw(elem: ElemType, ptr: *const u8, len: usize) -> Values<'a> {
        // SAFETY: forwarded to the caller.
        unsafe {
            match elem {
                ElemType::Bf16 => Values::Bf16(std::slice::from_raw_parts(ptr.cast(), len)),
                ElemType::F16 => Values::F16(std::slice::from_raw_parts(ptr.cast(), len)),
                ElemType::F32 => Values::F32(std::slice::from_raw_parts(ptr.cast(), len)),
            }
        }
    }
}

impl<'a> From<&'a [bf16]> for Values<'a> {
    fn from(s: &'a [bf16]) -> Self {
        Values::Bf16(s)
    }
}

impl<'a> From<&'a [f16]> for Values<'a> {
    fn from(s: &'a [f16]) -> Self {
        Values::F16(s)
    }
}

impl<'a> From<&'a [f32]> for Values<'a> {
    fn from(s: &'a [f32]) -> Self {
        Values::F32(s)
    }
}

impl<'a, T> From<&'a Vec<T>> for Values<'a>
where
    Values<'a>: From<&'a [T]>,
{
    fn from(v: &'a Vec<T>) -> Self {
        Values::from(v.as_slice())
    }
}

/// A float type the decoders produce: `f32` or `bf16`.
pub trait Decoded: sealed::Sealed + Copy + Default + Send + Sync + 'static {
    /// The matching [`ElemType`].
    const TYPE: ElemType;

    /// Converts a decoded value (bf16 rounds to nearest even, NaN to `0x7FFF`).
    fn from_f32(v: f32) -> Self;

    /// Converts a stored bf16 value given by its bits (exact for both types).
    fn from_bf16_bits(bits: u16) -> Self;
}

impl Decoded for f32 {
    const TYPE: ElemType = ElemType::F32;

    fn from_f32(v: f32) -> Self {
        v
    }

    fn from_bf16_bits(bits: u16) -> Self {
        f32::from_bits(u32::from(bits) << 16)
    }
}

impl Decoded for bf16 {
    const TYPE: ElemType = ElemType::Bf16;

    fn from_f32(v: f32) -> Self {
        bf16::from_bits(bf16_bits_from_f32(v))
    }

    fn from_bf16_bits(bits: u16) -> Self {
        bf16::from_bits(bits)
    }
}
