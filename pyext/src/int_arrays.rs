//! Integer arrays from Python (token ids, slot numbers, block ids): lists,
//! tuples, numpy arrays of any integer dtype (contiguous or strided, any byte
//! order), objects exporting an integer buffer (`array.array`,
//! `memoryview(b).cast("I")`) and other iterables of ints. Values the
//! target type cannot hold are a `ValueError`, non-integers a `TypeError`.
//! Arrays and buffers convert in bulk: one range check and one widening or
//! narrowing copy over the whole array, no Python object per element.

use std::fmt::Display;

use numpy::{
    PyArray1, PyArrayDescrMethods, PyArrayMethods, PyReadonlyArray1, PyUntypedArray,
    PyUntypedArrayMethods,
};
use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyByteArray, PyBytes, PyInt, PyList, PyString, PyTuple};

use mla_cache::fill_step;
use mla_cache::{BlockId, Error, TokenId};

/// Token ids (`0..=u32::MAX`); a lone integer (an int or a numpy integer
/// scalar) is one token.
pub(crate) fn tokens(obj: &Bound<'_, PyAny>) -> PyResult<Vec<TokenId>> {
    let lone = obj.is_exact_instance_of::<PyInt>()
        || !(obj.is_instance_of::<PyList>()
            || obj.is_instance_of::<PyTuple>()
            || obj.is_instance_of::<PyUntypedArray>())
            && obj.hasattr("__index__")?;
    if lone {
        return from_items(std::iter::once(obj.clone()), 1, "token id");
    }
    int_vec(obj, "token id")
}

/// Slot numbers (`i64`; negative ones mean "skip this token").
pub(crate) fn slots(obj: &Bound<'_, PyAny>) -> PyResult<Vec<i64>> {
    int_vec(obj, "slot")
}

/// Block ids (`0..=u32::MAX`; the store checks them against `num_blocks`).
pub(crate) fn block_ids(obj: &Bound<'_, PyAny>) -> PyResult<Vec<BlockId>> {
    int_vec(obj, "block id")
}

/// `(src, dst)` block pairs: an iterable of pairs or an `[N, 2]` integer array.
pub(crate) fn pairs(obj: &Bound<'_, PyAny>) -> PyResult<Vec<(BlockId, BlockId)>> {
    if let Ok(array) = obj.cast::<PyUntypedArray>() {
        if array.ndim() != 2 || array.shape()[1] != 2 {
            return Err(PyValueError::new_err(format!(
                "block pairs must have shape [N, 2], got {:?}",
                array.shape()
            )));
        }
        let flat: Vec<BlockId> = int_vec(&array.call_method1("reshape", (-1,))?, "block id")?;
        return Ok(flat.chunks_exact(2).map(|p| (p[0], p[1])).collect());
    }
    let mut out = Vec::new();
    for item in obj.try_iter()? {
        let pair: Vec<BlockId> = int_vec(&item?, "block id")?;
        match pair[..] {
            [src, dst] => out.push((src, dst)),
            _ => return Err(PyValueError::new_err("each block pair must be (src, dst)")),
        }
    }
    Ok(out)
}

/// A 1-D integer sequence or array, each value converted to `O`.
fn int_vec<O: Target>(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<O>> {
    if let Ok(list) = obj.cast::<PyList>() {
        return from_items(list.iter(), list.len(), what);
    }
    if let Ok(tuple) = obj.cast::<PyTuple>() {
        return from_items(tuple.iter(), tuple.len(), what);
    }
    if let Ok(array) = obj.cast::<PyUntypedArray>() {
        return from_array(array, what);
    }
    if obj.is_instance_of::<PyString>()
        || obj.is_instance_of::<PyBytes>()
        || obj.is_instance_of::<PyByteArray>()
    {
        return Err(PyTypeError::new_err(format!(
            "{what}s must be a sequence or array of ints, not str or bytes \
             (for packed 32-bit ids, pass memoryview(data).cast(\"I\"))"
        )));
    }
    if let Some(values) = from_buffer(obj, what)? {
        return Ok(values);
    }
    let iter = obj.try_iter().map_err(|_| {
        PyTypeError::new_err(format!(
            "{what}s must be a list, tuple or integer array, got {}",
            type_name(obj)
        ))
    })?;
    let items: Vec<Bound<'_, PyAny>> = iter.collect::<PyResult<_>>()?;
    let n = items.len();
    from_items(items.into_iter(), n, what)
}

/// The integer types arrays convert to.
trait Target:
    Copy
    + TryFrom<i64>
    + TryFrom<u64>
    + TryFrom<i32>
    + TryFrom<u32>
    + TryFrom<i16>
    + TryFrom<u16>
    + TryFrom<i8>
    + TryFrom<u8>
{
    /// The range, for messages.
    const RANGE: &'static str;
    /// `v as Self`, for a value known to fit.
    fn cast<T: Elem>(v: T) -> Self;
}

impl Target for u32 {
    const RANGE: &'static str = "0..=4294967295";
    fn cast<T: Elem>(v: T) -> Self {
        v.as_u32()
    }
}

impl Target for i64 {
    const RANGE: &'static str = "-2**63..2**63";
    fn cast<T: Elem>(v: T) -> Self {
        v.as_i64()
    }
}

fn from_items<'py, O: Target>(
    items: impl Iterator<Item = Bound<'py, PyAny>>,
    len: usize,
    what: &str,
) -> PyResult<Vec<O>> {
    let mut out = Vec::with_capacity(len);
    for (i, item) in items.enumerate() {
        if item.is_instance_of::<PyBool>() {
            return Err(PyTypeError::new_err(format!(
                "{what} at position {i} is a bool"
            )));
        }
        match item.extract::<i64>() {
            Ok(v) => out.push(O::try_from(v).map_err(|_| out_of_range::<O>(&v, i, what))?),
            Err(_) if item.hasattr("__index__")? => return Err(out_of_range::<O>(&item, i, what)),
            Err(_) => {
                return Err(PyTypeError::new_err(format!(
                    "{what} at position {i} must be an int, got {}",
                    type_name(&item)
                )))
            }
        }
    }
    Ok(out)
}

fn from_array<O: Target>(array: &Bound<'_, PyUntypedArray>, what: &str) -> PyResult<Vec<O>> {
    if array.ndim() != 1 {
        return Err(PyValueError::new_err(format!(
            "{what}s must be a 1-D array, got shape {:?}",
            array.shape()
        )));
    }
    macro_rules! typed {
        ($($t:ty),*) => {$(
            if let Ok(a) = array.cast::<PyArray1<$t>>() {
                return from_typed(a, what);
            }
        )*};
    }
    typed!(u32, i64, i32, u64, u16, i16, u8, i8);
    let dtype = array.dtype();
    match dtype.kind() {
        // An integer dtype in non-native byte order: convert once to native.
        kind @ (b'i' | b'u') => {
            let native = if kind == b'i' { "=i8" } else { "=u8" };
            let converted = array.call_method1("astype", (native,))?;
            from_array(converted.cast::<PyUntypedArray>()?, what)
        }
        _ => Err(PyTypeError::new_err(format!(
            "{what}s must have an integer dtype, got {dtype}"
        ))),
    }
}

fn from_typed<T, O>(array: &Bound<'_, PyArray1<T>>, what: &str) -> PyResult<Vec<O>>
where
    T: numpy::Element + Elem,
    O: Target + TryFrom<T>,
{
    let ro = array
        .try_readonly()
        .map_err(|e| PyValueError::new_err(format!("{what}s: {e}")))?;
    match ro.as_slice() {
        Ok(slice) => convert(slice, what),
        Err(_) => convert(&ro.as_array().iter().copied().collect::<Vec<T>>(), what),
    }
}

/// The values of an object exporting a 1-D buffer of integers, or `None`
/// when it exports none (or one of another item type).
fn from_buffer<O: Target>(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Option<Vec<O>>> {
    // SAFETY: `obj` is a live object while its `Bound` is held (GIL held);
    // the check only reads its type's buffer slot.
    if unsafe { pyo3::ffi::PyObject_CheckBuffer(obj.as_ptr()) } == 0 {
        return Ok(None);
    }
    macro_rules! typed {
        ($($t:ty),*) => {$(
            if let Ok(buffer) = PyBuffer::<$t>::get(obj) {
                if buffer.dimensions() != 1 {
                    return Err(PyValueError::new_err(format!(
                        "{what}s must be a 1-D buffer, got shape {:?}",
                        buffer.shape()
                    )));
                }
                return convert(&buffer.to_vec(obj.py())?, what).map(Some);
            }
        )*};
    }
    typed!(u32, i32, i64, u64, u16, i16, u8, i8);
    Ok(None)
}

/// `values` converted to `O`: one pass that copies them and checks their
/// range together (branch-free, so the compiler vectorizes it; the values,
/// a prompt that is usually not in cache, are read once); an error names
/// the first value out of range.
fn convert<T, O>(values: &[T], what: &str) -> PyResult<Vec<O>>
where
    T: Elem,
    O: Target + TryFrom<T>,
{
    let mut out = Vec::with_capacity(values.len());
    match append_checked(values, &mut out) {
        Ok(()) => Ok(out),
        Err(i) => Err(out_of_range::<O>(&values[i], i, what)),
    }
}

/// Appends `values` converted to `O` to `out` in one branch-free pass
/// (vectorized: the copy and the range check together), or fails with the
/// position of the first value out of range (`out` then holds garbage).
fn append_checked<T, O>(values: &[T], out: &mut Vec<O>) -> Result<(), usize>
where
    T: Elem,
    O: Target + TryFrom<T>,
{
    let mut in_range = true;
    out.extend(values.iter().map(|&v| {
        in_range &= O::try_from(v).is_ok();
        O::cast(v)
    }));
    if in_range {
        return Ok(());
    }
    Err(values
        .iter()
        .position(|&v| O::try_from(v).is_err())
        .expect("a value is out of range"))
}

/// A prompt's token ids from Python: a contiguous numpy array of a common
/// dtype, converted by the manager as it hashes it
/// (`BlockManager::admit_filled`, with [`PromptTokens::fill`]), or anything
/// else, converted at once.
pub(crate) enum PromptTokens<'py> {
    /// Converted (lists, tuples, other arrays and buffers).
    Converted(Vec<TokenId>),
    /// `int32` (numpy's array of Python ints on most platforms' C int).
    I32(PyReadonlyArray1<'py, i32>),
    /// `uint32`.
    U32(PyReadonlyArray1<'py, u32>),
    /// `int64`.
    I64(PyReadonlyArray1<'py, i64>),
}

impl<'py> PromptTokens<'py> {
    /// The prompt `obj` (as [`tokens`] takes it).
    pub(crate) fn extract(obj: &Bound<'py, PyAny>) -> PyResult<Self> {
        macro_rules! contiguous {
            ($($t:ty => $variant:ident),*) => {$(
                if let Ok(a) = obj.cast::<PyArray1<$t>>() {
                    if let Ok(ro) = a.try_readonly() {
                        if ro.as_slice().is_ok() {
                            return Ok(Self::$variant(ro));
                        }
                    }
                }
            )*};
        }
        contiguous!(i32 => I32, u32 => U32, i64 => I64);
        tokens(obj).map(Self::Converted)
    }

    /// The tokens, converted at once.
    pub(crate) fn into_vec(self) -> PyResult<Vec<TokenId>> {
        const WHAT: &str = "token id";
        match self {
            Self::Converted(tokens) => Ok(tokens),
            Self::I32(a) => convert(a.as_slice()?, WHAT),
            Self::U32(a) => convert(a.as_slice()?, WHAT),
            Self::I64(a) => convert(a.as_slice()?, WHAT),
        }
    }
}

/// One step of converting the prompt `values` into `tokens` up to `upto`
/// as the manager hashes it (`fill_step`); a value out of range is an
/// [`Error::InvalidArgument`] naming it and its position.
pub(crate) fn fill_tokens<T: Elem>(
    values: &[T],
    tokens: &mut Vec<TokenId>,
    upto: usize,
) -> mla_cache::Result<()>
where
    TokenId: TryFrom<T>,
{
    let start = tokens.len();
    fill_step(values, tokens, upto, |step, out| append_checked(step, out)).map_err(|i| {
        let i = start + i;
        Error::InvalidArgument(format!(
            "token id {} at position {i} is outside {}",
            values[i],
            <TokenId as Target>::RANGE
        ))
    })
}

/// The integer types arrays and buffers hold.
pub(crate) trait Elem: Copy + Display + Sync {
    /// `self as u32`.
    fn as_u32(self) -> u32;
    /// `self as i64`.
    fn as_i64(self) -> i64;
}

macro_rules! elems {
    ($($t:ty),*) => {$(
        impl Elem for $t {
            fn as_u32(self) -> u32 {
                self as u32
            }
            fn as_i64(self) -> i64 {
                self as i64
            }
        }
    )*};
}
elems!(u32, i32, i64, u64, u16, i16, u8, i8);

fn out_of_range<O: Target>(value: &dyn Display, i: usize, what: &str) -> PyErr {
    PyValueError::new_err(format!(
        "{what} {value} at position {i} is outside {}",
        O::RANGE
    ))
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map_or_else(|_| "?".into(), |n| n.to_string())
}
