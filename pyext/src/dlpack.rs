//! DLPack (unversioned, `"dltensor"` capsules): exporting a store's layer
//! memory and importing tensors from any producer (torch, cupy, numpy, ...)
//! without depending on them.
//!
//! ```text
//!   export: LayerBuffer.__dlpack__() -> capsule "dltensor"
//!             └─ Export { DLManagedTensor, shape, strides, Arc<store> }
//!           the consumer renames the capsule "used_dltensor" and calls the
//!           deleter when done; an unconsumed capsule runs it when collected.
//!   import: obj.__dlpack__() -> capsule, read while we hold it, never
//!           consumed: the producer's capsule destructor releases it.
//! ```

use std::ffi::{c_void, CStr};
use std::sync::Arc;

use pyo3::exceptions::{PyBufferError, PyTypeError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::layer_buffer::BufferView;
use mla_cache::store::{Device, LatentStore};

const CAPSULE: &CStr = c"dltensor";

/// `DLDeviceType` values used here.
pub(crate) const DEVICE_CPU: i32 = 1;
pub(crate) const DEVICE_CUDA: i32 = 2;
pub(crate) const DEVICE_CUDA_HOST: i32 = 3;

/// `DLDataTypeCode` values used here.
pub(crate) const CODE_INT: u8 = 0;
pub(crate) const CODE_UINT: u8 = 1;
pub(crate) const CODE_FLOAT: u8 = 2;
pub(crate) const CODE_BFLOAT: u8 = 4;

#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DLDevice {
    pub(crate) device_type: i32,
    pub(crate) device_id: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DLDataType {
    pub(crate) code: u8,
    pub(crate) bits: u8,
    pub(crate) lanes: u16,
}

#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

/// The DLPack device of a store device.
pub(crate) fn device_of(device: Device) -> DLDevice {
    match device {
        Device::Host => DLDevice {
            device_type: DEVICE_CPU,
            device_id: 0,
        },
        Device::Cuda(n) => DLDevice {
            device_type: DEVICE_CUDA,
            device_id: n as i32,
        },
    }
}

/// What an exported capsule owns; `managed` first, so the two share an address.
#[repr(C)]
struct Export {
    managed: DLManagedTensor,
    shape: [i64; 3],
    strides: [i64; 3],
    _owner: Arc<dyn LatentStore>,
}

unsafe extern "C" fn delete_export(managed: *mut DLManagedTensor) {
    // SAFETY: `managed` is the first field of an `Export` leaked by
    // `export_layer`; the deleter runs once, by the protocol.
    drop(unsafe { Box::from_raw(managed.cast::<Export>()) });
}

unsafe extern "C" fn destroy_capsule(capsule: *mut ffi::PyObject) {
    // SAFETY: called by Python with a live capsule. A consumer that took
    // the tensor renamed the capsule; then it owns the deleter call.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, CAPSULE.as_ptr()) == 1 {
            let managed =
                ffi::PyCapsule_GetPointer(capsule, CAPSULE.as_ptr()).cast::<DLManagedTensor>();
            if let Some(deleter) = (*managed).deleter {
                deleter(managed);
            }
        }
    }
}

/// A `"dltensor"` capsule of the uint8 `[num_blocks, block_size,
/// bytes_per_token]` memory of a layer, keeping `owner` alive.
pub(crate) fn export_layer<'py>(
    py: Python<'py>,
    view: &BufferView,
    owner: Arc<dyn LatentStore>,
) -> PyResult<Bound<'py, PyAny>> {
    let mut export = Box::new(Export {
        managed: DLManagedTensor {
            dl_tensor: DLTensor {
                data: view.addr as *mut c_void,
                device: device_of(view.device),
                ndim: 3,
                dtype: DLDataType {
                    code: CODE_UINT,
                    bits: 8,
                    lanes: 1,
                },
                shape: std::ptr::null_mut(),
                strides: std::ptr::null_mut(),
                byte_offset: 0,
            },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_export),
        },
        shape: view.shape.map(|d| d as i64),
        strides: view.strides.map(|s| s as i64),
        _owner: owner,
    });
    export.managed.dl_tensor.shape = export.shape.as_mut_ptr();
    export.managed.dl_tensor.strides = export.strides.as_mut_ptr();
    let ptr = Box::into_raw(export);
    // SAFETY: `ptr` is a valid, leaked `Export`; the capsule (or its
    // consumer) frees it exactly once through the deleter.
    unsafe {
        (*ptr).managed.manager_ctx = ptr.cast();
        let capsule = ffi::PyCapsule_New(ptr.cast(), CAPSULE.as_ptr(), Some(destroy_capsule));
        if capsule.is_null() {
            drop(Box::from_raw(ptr));
            return Err(PyErr::fetch(py));
        }
        Ok(Bound::from_owned_ptr(py, capsule))
    }
}

/// A tensor read from a producer's capsule, valid while `capsule` lives.
pub(crate) struct Imported<'py> {
    /// The capsule; the tensor is valid while it lives.
    pub(crate) capsule: Bound<'py, PyAny>,
    /// Address of the first element (byte offset applied).
    pub(crate) addr: usize,
    pub(crate) device: DLDevice,
    pub(crate) dtype: DLDataType,
    pub(crate) shape: Vec<i64>,
    /// Strides in elements; `None` means C-contiguous.
    pub(crate) strides: Option<Vec<i64>>,
}

/// Imports `obj` through its `__dlpack__` method; `stream` is passed on
/// for CUDA producers (the consumer's stream, per the protocol).
pub(crate) fn import<'py>(
    obj: &Bound<'py, PyAny>,
    stream: Option<usize>,
) -> PyResult<Imported<'py>> {
    let py = obj.py();
    let capsule = match stream {
        Some(s) => {
            let kwargs = PyDict::new(py);
            kwargs.set_item("stream", s)?;
            obj.call_method("__dlpack__", (), Some(&kwargs))?
        }
        None => obj.call_method0("__dlpack__")?,
    };
    // SAFETY: `capsule` is a live object; a valid "dltensor" capsule holds a
    // `DLManagedTensor` that stays valid while the capsule lives (we never
    // consume it).
    unsafe {
        if ffi::PyCapsule_IsValid(capsule.as_ptr(), CAPSULE.as_ptr()) != 1 {
            return Err(PyTypeError::new_err(
                "__dlpack__ did not return a \"dltensor\" capsule (a consumed or versioned one?)",
            ));
        }
        let managed =
            ffi::PyCapsule_GetPointer(capsule.as_ptr(), CAPSULE.as_ptr()).cast::<DLManagedTensor>();
        if managed.is_null() {
            return Err(PyErr::fetch(py));
        }
        let t = &(*managed).dl_tensor;
        let ndim = usize::try_from(t.ndim).map_err(|_| PyBufferError::new_err("negative ndim"))?;
        let shape = if ndim == 0 {
            Vec::new()
        } else {
            std::slice::from_raw_parts(t.shape, ndim).to_vec()
        };
        let strides = (!t.strides.is_null() && ndim > 0)
            .then(|| std::slice::from_raw_parts(t.strides, ndim).to_vec());
        Ok(Imported {
            addr: (t.data as usize).wrapping_add(t.byte_offset as usize),
            device: t.device,
            dtype: t.dtype,
            shape,
            strides,
            capsule,
        })
    }
}
