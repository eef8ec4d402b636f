//! Token ids from Python: lists, tuples, numpy integer arrays of any integer
//! dtype (contiguous or strided, any byte order) and other iterables of ints.
//! Values outside `0..=u32::MAX` are a `ValueError`, non-integers a `TypeError`.

use std::fmt::Display;

use numpy::{PyArray1, PyArrayDescrMethods, PyArrayMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyInt, PyList, PyString, PyTuple};

use crate::TokenId;

/// Converts a Python sequence or array of token ids; a lone int is one token.
pub(crate) fn tokens(obj: &Bound<'_, PyAny>) -> PyResult<Vec<TokenId>> {
    if obj.is_exact_instance_of::<PyInt>() {
        return Ok(vec![in_range(obj.extract::<i64>().map_err(|_| out_of_range(obj, 0))?, 0)?]);
    }
    if let Ok(list) = obj.cast::<PyList>() {
        return from_items(list.iter(), list.len());
    }
    if let Ok(tuple) = obj.cast::<PyTuple>() {
        return from_items(tuple.iter(), tuple.len());
    }
    if let Ok(array) = obj.cast::<PyUntypedArray>() {
        return from_array(array);
    }
    if obj.is_instance_of::<PyString>() || obj.is_instance_of::<PyBytes>() {
        return Err(PyTypeError::new_err(
            "token ids must be a sequence or array of ints, not str or bytes",
        ));
    }
    let iter = obj.try_iter().map_err(|_| {
        PyTypeError::new_err(format!(
            "token ids must be a list, tuple or integer array, got {}",
            type_name(obj)
        ))
    })?;
    let items: Vec<Bound<'_, PyAny>> = iter.collect::<PyResult<_>>()?;
    let n = items.len();
    from_items(items.into_iter(), n)
}

fn from_items<'py>(items: impl Iterator<Item = Bound<'py, PyAny>>, len: usize) -> PyResult<Vec<TokenId>> {
    let mut out = Vec::with_capacity(len);
    for (i, item) in items.enumerate() {
        if item.is_instance_of::<PyBool>() {
            return Err(PyTypeError::new_err(format!("token id at position {i} is a bool")));
        }
        match item.extract::<i64>() {
            Ok(v) => out.push(in_range(v, i)?),
            Err(_) if item.hasattr("__index__")? => return Err(out_of_range(&item, i)),
            Err(_) => {
                return Err(PyTypeError::new_err(format!(
                    "token id at position {i} must be an int, got {}",
                    type_name(&item)
                )))
            }
        }
    }
    Ok(out)
}

fn from_array(array: &Bound<'_, PyUntypedArray>) -> PyResult<Vec<TokenId>> {
    if array.ndim() != 1 {
        return Err(PyValueError::new_err(format!(
            "token ids must be a 1-D array, got shape {:?}",
            array.shape()
        )));
    }
    macro_rules! typed {
        ($($t:ty),*) => {$(
            if let Ok(a) = array.cast::<PyArray1<$t>>() {
                return from_typed(a);
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
            from_array(converted.cast::<PyUntypedArray>()?)
        }
        _ => Err(PyTypeError::new_err(format!(
            "token ids must have an integer dtype, got {dtype}"
        ))),
    }
}

fn from_typed<T>(array: &Bound<'_, PyArray1<T>>) -> PyResult<Vec<TokenId>>
where
    T: numpy::Element + Copy + Display,
    TokenId: TryFrom<T>,
{
    let ro = array
        .try_readonly()
        .map_err(|e| PyValueError::new_err(format!("token ids: {e}")))?;
    let mut out = Vec::with_capacity(ro.len());
    let mut push = |i: usize, v: T| -> PyResult<()> {
        let t = TokenId::try_from(v).map_err(|_| {
            PyValueError::new_err(format!(
                "token id {v} at position {i} is outside 0..={}",
                TokenId::MAX
            ))
        })?;
        out.push(t);
        Ok(())
    };
    match ro.as_slice() {
        Ok(slice) => slice.iter().enumerate().try_for_each(|(i, &v)| push(i, v))?,
        Err(_) => ro
            .as_array()
            .iter()
            .enumerate()
            .try_for_each(|(i, &v)| push(i, v))?,
    }
    Ok(out)
}

fn in_range(v: i64, i: usize) -> PyResult<TokenId> {
    TokenId::try_from(v).map_err(|_| {
        PyValueError::new_err(format!(
            "token id {v} at position {i} is outside 0..={}",
            TokenId::MAX
        ))
    })
}

fn out_of_range(item: &Bound<'_, PyAny>, i: usize) -> PyErr {
    PyValueError::new_err(format!(
        "token id {item} at position {i} is outside 0..={}",
        TokenId::MAX
    ))
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map_or_else(|_| "?".into(), |n| n.to_string())
}
