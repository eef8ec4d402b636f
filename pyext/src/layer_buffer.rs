//! `LayerBuffer`: the raw memory of one layer of a store (its latents or its
//! indexer keys), exported through DLPack and as a raw pointer, keeping the
//! store alive.

use std::sync::Arc;

use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;

use super::dlpack;
use super::tensors::device_name;
use mla_cache::store::{Device, IndexerView, LatentStore, LayerView};

/// The bytes a [`LayerBuffer`] hands out: a layer's latents or its indexer keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BufferView {
    /// Address of the first byte.
    pub addr: usize,
    /// Where the bytes are.
    pub device: Device,
    /// Dimensions, in bytes.
    pub shape: [usize; 3],
    /// Strides of `shape`, in bytes.
    pub strides: [usize; 3],
    /// What the bytes hold: a latent format's name, or `indexer_fp8`.
    pub format: &'static str,
}

impl BufferView {
    /// Bytes of the buffer.
    pub fn len_bytes(&self) -> usize {
        self.shape.iter().product()
    }
}

impl From<LayerView> for BufferView {
    fn from(v: LayerView) -> Self {
        Self {
            addr: v.addr,
            device: v.device,
            shape: v.shape,
            strides: v.strides,
            format: v.dtype.name(),
        }
    }
}

impl From<IndexerView> for BufferView {
    fn from(v: IndexerView) -> Self {
        Self {
            addr: v.addr,
            device: v.device,
            shape: v.shape,
            strides: v.strides,
            format: "indexer_fp8",
        }
    }
}

/// The memory of one layer of a ``LatentStore``: ``uint8`` of shape
/// ``[num_blocks, block_size, bytes_per_token]``, contiguous, on the store's
/// device; for the indexer keys (``format`` ``"indexer_fp8"``)
/// ``[num_blocks, block_size, head_dim + 4]``, each block all codes first,
/// then all fp32 scales. Pass it to ``torch.from_dlpack`` (or ``numpy.from_dlpack`` on the
/// CPU) for a zero-copy tensor, or use ``data_ptr()`` with an attention
/// kernel. It keeps the store's memory alive. Writes through it bypass the
/// store's locks, and ``__dlpack__`` ignores ``stream``: order accesses with
/// the store's own operations yourself.
#[pyclass(frozen, module = "mla_cache")]
pub struct LayerBuffer {
    store: Arc<dyn LatentStore>,
    view: BufferView,
    layer: usize,
}

impl LayerBuffer {
    pub(crate) fn new(store: Arc<dyn LatentStore>, view: BufferView, layer: usize) -> Self {
        Self { store, view, layer }
    }
}

#[pymethods]
impl LayerBuffer {
    /// Exports the layer as a DLPack capsule (unversioned ``"dltensor"``).
    #[pyo3(signature = (*, stream = None, max_version = None, dl_device = None, copy = None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<&Bound<'py, PyAny>>,
        max_version: Option<&Bound<'py, PyAny>>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let _ = (stream, max_version);
        let here = dlpack::device_of(self.view.device);
        if let Some((device_type, device_id)) = dl_device {
            if (device_type, device_id) != (here.device_type, here.device_id) {
                return Err(PyBufferError::new_err(
                    "a LayerBuffer can only be exported on its own device",
                ));
            }
        }
        if copy == Some(true) {
            return Err(PyBufferError::new_err(
                "a LayerBuffer is exported without copies",
            ));
        }
        dlpack::export_layer(py, &self.view, Arc::clone(&self.store))
    }

    /// ``(device_type, device_id)`` in DLPack's numbering (1 = CPU, 2 = CUDA).
    fn __dlpack_device__(&self) -> (i32, i32) {
        let d = dlpack::device_of(self.view.device);
        (d.device_type, d.device_id)
    }

    /// Address of the layer's first byte (host or device memory).
    fn data_ptr(&self) -> usize {
        self.view.addr
    }

    /// ``(num_blocks, block_size, bytes_per_token)``.
    #[getter]
    fn shape(&self) -> (usize, usize, usize) {
        let [a, b, c] = self.view.shape;
        (a, b, c)
    }

    /// Strides of ``shape`` in bytes.
    #[getter]
    fn strides(&self) -> (usize, usize, usize) {
        let [a, b, c] = self.view.strides;
        (a, b, c)
    }

    /// Element type of the buffer: always ``"uint8"``.
    #[getter]
    fn dtype(&self) -> &'static str {
        "uint8"
    }

    /// What it holds: the latents' storage format (``"bf16"``,
    /// ``"fp8_ds_mla"``, ``"mxfp6"``, ``"nvfp4_ds_mla"``), or ``"indexer_fp8"``
    /// for indexer keys.
    #[getter]
    fn format(&self) -> &'static str {
        self.view.format
    }

    /// ``"cpu"`` or ``"cuda:N"``.
    #[getter]
    fn device(&self) -> String {
        device_name(self.view.device)
    }

    /// The layer index.
    #[getter]
    fn layer(&self) -> usize {
        self.layer
    }

    /// Bytes of the layer.
    #[getter]
    fn nbytes(&self) -> usize {
        self.view.len_bytes()
    }

    fn __repr__(&self) -> String {
        format!(
            "LayerBuffer(layer={}, shape={:?}, format='{}', device='{}', data_ptr={:#x})",
            self.layer,
            self.view.shape,
            self.view.format,
            device_name(self.view.device),
            self.view.addr
        )
    }
}
