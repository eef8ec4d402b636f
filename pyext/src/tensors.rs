//! Tensor arguments of store operations, from numpy arrays, DLPack producers
//! (torch, cupy, ...) or raw `(data_ptr, shape, dtype)` tuples, turned into
//! the store's descriptors ([`MatrixDesc`], [`VectorDesc`]).
//!
//! A raw tuple describes a C-contiguous tensor in the store's own memory
//! space; the caller vouches that the address is valid for the call (or, on
//! a GPU, until the stream reaches the operation).

use numpy::{PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyString, PyTuple};

use super::dlpack;
use super::ints;
use mla_cache::codec::ElemType;
use mla_cache::store::{Device, MatrixDesc, VectorDesc};

/// Element types the store operations take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Elem {
    /// A float type the codecs read or write.
    Float(ElemType),
    /// `int32`.
    I32,
    /// `uint32`.
    U32,
    /// `int64`.
    I64,
}

impl Elem {
    fn size(self) -> usize {
        match self {
            Elem::Float(e) => e.size(),
            Elem::I32 | Elem::U32 => 4,
            Elem::I64 => 8,
        }
    }

    /// Parses `bfloat16`, `float16`, `float32`, `int32`, `uint32`, `int64`
    /// and their short or torch spellings.
    pub(crate) fn parse(name: &str) -> Option<Self> {
        Some(match name.trim_start_matches("torch.") {
            "bfloat16" | "bf16" => Elem::Float(ElemType::Bf16),
            "float16" | "half" | "f16" => Elem::Float(ElemType::F16),
            "float32" | "float" | "f32" => Elem::Float(ElemType::F32),
            "int32" | "int" | "i32" => Elem::I32,
            "uint32" | "u32" => Elem::U32,
            "int64" | "long" | "i64" => Elem::I64,
            _ => return None,
        })
    }

    fn from_dlpack(t: dlpack::DLDataType) -> Option<Self> {
        if t.lanes != 1 {
            return None;
        }
        Some(match (t.code, t.bits) {
            (dlpack::CODE_BFLOAT, 16) => Elem::Float(ElemType::Bf16),
            (dlpack::CODE_FLOAT, 16) => Elem::Float(ElemType::F16),
            (dlpack::CODE_FLOAT, 32) => Elem::Float(ElemType::F32),
            (dlpack::CODE_INT, 32) => Elem::I32,
            (dlpack::CODE_UINT, 32) => Elem::U32,
            (dlpack::CODE_INT, 64) => Elem::I64,
            _ => return None,
        })
    }
}

/// A tensor argument: address, element type, shape and byte strides.
pub(crate) struct Tensor<'py> {
    addr: usize,
    /// `None` for an element type no operation takes (named in `elem_name`).
    elem: Option<Elem>,
    elem_name: String,
    shape: Vec<usize>,
    /// In bytes.
    strides: Vec<isize>,
    pub(crate) device: Device,
    pub(crate) writable: bool,
    /// Keeps the memory alive while the descriptor is in use (the array or
    /// the producer's capsule).
    _keep: Option<Bound<'py, PyAny>>,
}

impl<'py> Tensor<'py> {
    /// Reads `obj` as a tensor; `device` is the store's (and a raw tuple's)
    /// device; `stream` goes to CUDA DLPack producers. A numpy array whose
    /// rows are not contiguous is copied when `copy_ok`.
    pub(crate) fn extract(
        obj: &Bound<'py, PyAny>,
        device: Device,
        stream: usize,
        copy_ok: bool,
    ) -> PyResult<Self> {
        if let Some(t) = Self::raw_tuple(obj, device)? {
            return Ok(t);
        }
        if let Ok(array) = obj.cast::<PyUntypedArray>() {
            return Self::numpy(array, copy_ok);
        }
        if obj.hasattr("__dlpack__")? {
            return Self::dlpack(obj, device, stream);
        }
        Err(PyTypeError::new_err(format!(
            "expected a numpy array, a DLPack tensor or a (data_ptr, shape, dtype) tuple, got {}",
            obj.get_type().name()?
        )))
    }

    fn raw_tuple(obj: &Bound<'py, PyAny>, device: Device) -> PyResult<Option<Self>> {
        if !is_raw_tuple(obj) {
            return Ok(None);
        }
        let t = obj.cast::<PyTuple>()?;
        let (ptr, shape, dtype) = (t.get_item(0)?, t.get_item(1)?, t.get_item(2)?);
        let addr = usize::try_from(ints::u64_of(&ptr)?)
            .map_err(|_| PyValueError::new_err("data_ptr does not fit in an address"))?;
        let shape: Vec<usize> = shape
            .try_iter()?
            .map(|d| ints::size(&d?))
            .collect::<PyResult<_>>()?;
        let elem_name = dtype_name(&dtype)?;
        let elem = Elem::parse(&elem_name);
        let size = elem.map_or(1, Elem::size);
        let mut strides = vec![0isize; shape.len()];
        let mut step = size as isize;
        for (s, &d) in strides.iter_mut().zip(&shape).rev() {
            *s = step;
            step = step.saturating_mul(d as isize);
        }
        Ok(Some(Self {
            addr,
            elem,
            elem_name,
            shape,
            strides,
            device,
            writable: true,
            _keep: None,
        }))
    }

    fn numpy(array: &Bound<'py, PyUntypedArray>, copy_ok: bool) -> PyResult<Self> {
        let strides = array.strides().to_vec();
        let itemsize = array.dtype().itemsize() as isize;
        let ndim = strides.len();
        let rows_contiguous = ndim == 0
            || (array.shape()[ndim - 1] <= 1 || strides[ndim - 1] == itemsize)
                && strides.iter().all(|&s| s >= 0);
        if !rows_contiguous && copy_ok {
            let numpy = array.py().import("numpy")?;
            let copy = numpy.call_method1("ascontiguousarray", (array,))?;
            return Self::numpy(copy.cast::<PyUntypedArray>()?, false);
        }
        let dtype = array.dtype();
        let native = dtype.is_native_byteorder() != Some(false);
        let elem_name = dtype.to_string();
        let elem = if native {
            Elem::parse(&elem_name).filter(|e| e.size() == itemsize as usize)
        } else {
            None
        };
        // SAFETY: reading the fields of a live array object.
        let (flags, data) = unsafe {
            let raw = &*array.as_array_ptr();
            (raw.fields.flags, raw.fields.data)
        };
        Ok(Self {
            addr: data as usize,
            elem,
            elem_name,
            shape: array.shape().to_vec(),
            strides,
            device: Device::Host,
            writable: flags & numpy::npyffi::NPY_ARRAY_WRITEABLE != 0,
            _keep: Some(array.clone().into_any()),
        })
    }

    fn dlpack(obj: &Bound<'py, PyAny>, device: Device, stream: usize) -> PyResult<Self> {
        // Per the protocol, a CUDA consumer names its stream; 1 is the
        // legacy default stream (0 is not allowed).
        let stream =
            matches!(device, Device::Cuda(_)).then_some(if stream == 0 { 1 } else { stream });
        let t = dlpack::import(obj, stream)?;
        let elem = Elem::from_dlpack(t.dtype);
        let size = elem.map_or(1, Elem::size) as isize;
        let shape: Vec<usize> = t
            .shape
            .iter()
            .map(|&d| usize::try_from(d).map_err(|_| PyValueError::new_err("negative dimension")))
            .collect::<PyResult<_>>()?;
        let strides: Vec<isize> = match &t.strides {
            Some(s) => s.iter().map(|&x| x as isize * size).collect(),
            None => {
                let mut out = vec![0isize; shape.len()];
                let mut step = size;
                for (s, &d) in out.iter_mut().zip(&shape).rev() {
                    *s = step;
                    step = step.saturating_mul(d as isize);
                }
                out
            }
        };
        let dev = match t.device.device_type {
            dlpack::DEVICE_CPU | dlpack::DEVICE_CUDA_HOST => Device::Host,
            dlpack::DEVICE_CUDA => Device::Cuda(t.device.device_id.max(0) as usize),
            other => {
                return Err(PyValueError::new_err(format!(
                    "unsupported DLPack device type {other}"
                )))
            }
        };
        let dt = t.dtype;
        Ok(Self {
            addr: t.addr,
            elem,
            elem_name: format!(
                "DLPack type code {} with {} bits x {}",
                dt.code, dt.bits, dt.lanes
            ),
            shape,
            strides,
            device: dev,
            writable: true,
            _keep: Some(t.capsule),
        })
    }

    /// Checks that the tensor lives on `device`.
    pub(crate) fn on(&self, device: Device, name: &str) -> PyResult<()> {
        if self.device == device {
            Ok(())
        } else {
            Err(PyValueError::new_err(format!(
                "{name} is on {} but the store is on {}",
                device_name(self.device),
                device_name(device)
            )))
        }
    }

    fn elem_in(&self, name: &str, allowed: &[Elem], expected: &str) -> PyResult<Elem> {
        match self.elem {
            Some(e) if allowed.contains(&e) => Ok(e),
            _ => Err(PyTypeError::new_err(format!(
                "{name} must be {expected}, got {}",
                self.elem_name
            ))),
        }
    }

    /// A 2-D float tensor whose rows are contiguous.
    pub(crate) fn matrix(&self, name: &str, allowed: &[ElemType]) -> PyResult<MatrixDesc> {
        let allowed: Vec<Elem> = allowed.iter().map(|&e| Elem::Float(e)).collect();
        let names: Vec<&str> = allowed
            .iter()
            .map(|e| match e {
                Elem::Float(ElemType::Bf16) => "bfloat16",
                Elem::Float(ElemType::F16) => "float16",
                _ => "float32",
            })
            .collect();
        let expected = match names.split_last() {
            Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
            _ => names.join(""),
        };
        let Elem::Float(elem) = self.elem_in(name, &allowed, &expected)? else {
            unreachable!("only float types are allowed");
        };
        if self.shape.len() != 2 {
            return Err(PyValueError::new_err(format!(
                "{name} must be 2-D, got shape {:?}",
                self.shape
            )));
        }
        let (rows, cols) = (self.shape[0], self.shape[1]);
        let size = elem.size() as isize;
        if cols > 1 && self.strides[1] != size {
            return Err(PyValueError::new_err(format!(
                "{name}: elements within a row must be contiguous"
            )));
        }
        let row_stride = if rows > 1 {
            self.strides[0]
        } else {
            cols as isize * size
        };
        let row_stride = usize::try_from(row_stride)
            .map_err(|_| PyValueError::new_err(format!("{name}: negative row stride")))?;
        Ok(MatrixDesc {
            addr: self.addr,
            elem,
            rows,
            cols,
            row_stride,
        })
    }

    /// A contiguous 1-D tensor of one of the `allowed` integer types.
    pub(crate) fn vector<T>(
        &self,
        name: &str,
        allowed: &[Elem],
        expected: &str,
    ) -> PyResult<VectorDesc<T>> {
        let elem = self.elem_in(name, allowed, expected)?;
        if self.shape.len() != 1 {
            return Err(PyValueError::new_err(format!(
                "{name} must be 1-D, got shape {:?}",
                self.shape
            )));
        }
        if self.shape[0] > 1 && self.strides[0] != elem.size() as isize {
            return Err(PyValueError::new_err(format!("{name} must be contiguous")));
        }
        Ok(VectorDesc::new(self.addr, self.shape[0]))
    }
}

/// Whether `obj` is a `(data_ptr, shape, dtype)` tuple.
pub(crate) fn is_raw_tuple(obj: &Bound<'_, PyAny>) -> bool {
    obj.cast::<PyTuple>().is_ok_and(|t| {
        t.len() == 3
            && t.get_item(1)
                .is_ok_and(|s| s.is_instance_of::<PyTuple>() || s.is_instance_of::<PyList>())
    })
}

/// The dtype name of a raw tuple's third item: a string, a numpy dtype or
/// scalar type, or a torch dtype (`torch.bfloat16`).
fn dtype_name(dtype: &Bound<'_, PyAny>) -> PyResult<String> {
    if let Ok(s) = dtype.cast::<PyString>() {
        return Ok(s.to_str()?.to_owned());
    }
    let numpy = dtype.py().import("numpy")?;
    if let Ok(d) = numpy.call_method1("dtype", (dtype,)) {
        return d.getattr("name")?.extract();
    }
    Ok(dtype.str()?.to_str()?.to_owned())
}

/// `cpu` or `cuda:N`.
pub(crate) fn device_name(device: Device) -> String {
    match device {
        Device::Host => "cpu".into(),
        Device::Cuda(n) => format!("cuda:{n}"),
    }
}
