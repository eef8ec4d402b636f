//! `LatentStore`: the cached latents of every layer (and DeepSeek-V3.2's
//! indexer keys), on the host or a GPU, with quantizing writes, decoding
//! gathers and block copies.

use std::sync::Arc;

use numpy::ndarray::ArrayView3;
use numpy::{PyArray1, PyArray2, PyArray3, PyArrayMethods, PyUntypedArray};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use super::config::CacheConfig;
use super::errors;
use super::int_arrays;
use super::ints;
use super::layer_buffer::{BufferView, LayerBuffer};
use super::tensors::{device_name, is_raw_tuple, Elem, Tensor};
use mla_cache::codec::ElemType;
use mla_cache::store::{
    self, Device, HostStore, HostStoreOptions, MatrixDesc, Part, Stream, VectorDesc,
};
use mla_cache::tier::BlockTransfer;
use mla_cache::{config, Error, Result};

/// The cached latents of every layer, ``[num_blocks, block_size,
/// bytes_per_token]`` bytes per layer in the config's format (``bf16``,
/// ``fp8_ds_mla``, ``mxfp6`` or ``nvfp4_ds_mla``), on ``device`` (``"cpu"`` or ``"cuda:N"``).
/// Block ids and slots come from a ``BlockManager`` with the same config.
///
/// Tensor arguments are numpy arrays (host), DLPack tensors (``torch``,
/// ``cupy``, ...) or raw ``(data_ptr, shape, dtype)`` tuples (C-contiguous,
/// in the store's memory space); integer arguments of a host store may also
/// be lists. Operations on a GPU store are enqueued on ``stream`` (a
/// ``CUstream`` as an int, 0 for the default stream) without synchronizing:
/// keep the inputs alive until the stream reaches them. Host operations
/// run at once, without the GIL.
///
/// Raises ``StorageError`` when the device is unavailable (``"cuda:0"``
/// without a GPU or without CUDA support in this build), ``ValueError`` and
/// ``TypeError`` for bad arguments.
#[pyclass(frozen, module = "mla_cache")]
pub struct LatentStore {
    store: Arc<dyn store::LatentStore>,
    /// The same store, for whole-block copies by a ``TieredCache``.
    blocks: Arc<dyn BlockTransfer>,
    config: Py<CacheConfig>,
}

/// A store, seen as latents and as whole blocks.
type Opened = (Arc<dyn store::LatentStore>, Arc<dyn BlockTransfer>);

/// Stored indexer keys as host arrays: e4m3 codes and fp32 scales.
type QuantizedKeys<'py> = (Bound<'py, PyArray2<u8>>, Bound<'py, PyArray1<f32>>);

/// Shares a freshly opened store as both views.
fn opened<S: store::LatentStore + BlockTransfer + 'static>(s: S) -> Opened {
    let s = Arc::new(s);
    (s.clone(), s)
}

/// Parses `cpu`, `host`, `cuda` or `cuda:N`.
fn parse_device(name: &str) -> PyResult<Device> {
    match name {
        "cpu" | "host" => Ok(Device::Host),
        "cuda" => Ok(Device::Cuda(0)),
        _ => name
            .strip_prefix("cuda:")
            .and_then(|n| n.parse().ok())
            .map(Device::Cuda)
            .ok_or_else(|| {
                PyValueError::new_err(format!(
                    "unknown device {name:?} (expected \"cpu\" or \"cuda:N\")"
                ))
            }),
    }
}

/// Opens a store of `config` on `device`.
fn open(config: &config::CacheConfig, device: Device, huge_pages: bool) -> Result<Opened> {
    match device {
        Device::Host => Ok(opened(HostStore::with_options(
            config,
            HostStoreOptions { huge_pages },
        )?)),
        Device::Cuda(n) => open_cuda(config, n),
    }
}

#[cfg(feature = "cuda")]
fn open_cuda(config: &config::CacheConfig, ordinal: usize) -> Result<Opened> {
    match store::CudaStore::new(config, ordinal) {
        Ok(s) => Ok(opened(s)),
        Err(Error::Storage(m)) => Err(Error::Storage(format!("cuda:{ordinal}: {m}"))),
        Err(e) => Err(e),
    }
}

#[cfg(not(feature = "cuda"))]
fn open_cuda(_config: &config::CacheConfig, ordinal: usize) -> Result<Opened> {
    Err(Error::Storage(format!(
        "cuda:{ordinal} requested, but this build of mla_cache has no CUDA support \
         (build it with the `cuda` feature)"
    )))
}

/// An integer vector argument and what keeps its memory alive.
struct IntArg<'py, T> {
    desc: VectorDesc<T>,
    _owned: Vec<T>,
    _tensor: Option<Tensor<'py>>,
}

impl LatentStore {
    /// The store as whole blocks, and its configuration.
    pub(crate) fn blocks(&self) -> (Arc<dyn BlockTransfer>, &config::CacheConfig) {
        (Arc::clone(&self.blocks), self.store.config())
    }

    fn place(&self) -> Device {
        self.store.device()
    }

    /// Reads an integer vector: lists, numpy and CPU DLPack arrays are
    /// converted on a host store; device tensors and raw tuples are used in
    /// place when of an `allowed` type.
    fn int_arg<'py, T>(
        &self,
        obj: &Bound<'py, PyAny>,
        name: &str,
        (allowed, expected): (&[Elem], &str),
        convert: fn(&Bound<'py, PyAny>) -> PyResult<Vec<T>>,
        stream: usize,
    ) -> PyResult<IntArg<'py, T>> {
        let device = self.place();
        if device == Device::Host && !is_raw_tuple(obj) {
            let owned = if obj.cast::<PyUntypedArray>().is_err() && obj.hasattr("__dlpack__")? {
                convert(
                    &obj.py()
                        .import("numpy")?
                        .call_method1("from_dlpack", (obj,))?,
                )?
            } else {
                convert(obj)?
            };
            return Ok(IntArg {
                desc: VectorDesc::from_slice(&owned),
                _owned: owned,
                _tensor: None,
            });
        }
        let tensor = Tensor::extract(obj, device, stream, false)?;
        tensor.on(device, name)?;
        Ok(IntArg {
            desc: tensor.vector(name, allowed, expected)?,
            _owned: Vec::new(),
            _tensor: Some(tensor),
        })
    }

    /// A float matrix argument on the store's device.
    fn matrix<'py>(
        &self,
        obj: &Bound<'py, PyAny>,
        name: &str,
        allowed: &[ElemType],
        stream: usize,
        output: bool,
    ) -> PyResult<(MatrixDesc, Tensor<'py>)> {
        let tensor = Tensor::extract(obj, self.place(), stream, !output)?;
        tensor.on(self.place(), name)?;
        if output && !tensor.writable {
            return Err(PyValueError::new_err(format!("{name} is read-only")));
        }
        let desc = tensor.matrix(name, allowed)?;
        self.disjoint(name, desc.addr, matrix_extent(&desc))?;
        Ok((desc, tensor))
    }

    /// Refuses arguments that overlap the store's own memory.
    fn disjoint(&self, name: &str, addr: usize, len: usize) -> PyResult<()> {
        if len == 0 {
            return Ok(());
        }
        for layer in 0..self.store.config().num_layers {
            let view = self.store.layer_view(layer).map_err(errors::to_py)?;
            if addr < view.addr + view.len_bytes() && view.addr < addr.saturating_add(len) {
                return Err(PyValueError::new_err(format!(
                    "{name} overlaps the store's memory (layer {layer})"
                )));
            }
            if let Ok(view) = self.store.indexer_view(layer) {
                if addr < view.addr + view.len_bytes() && view.addr < addr.saturating_add(len) {
                    return Err(PyValueError::new_err(format!(
                        "{name} overlaps the store's indexer keys (layer {layer})"
                    )));
                }
            }
        }
        Ok(())
    }

    /// A write of `part` (`write`, `write_indexer`): row `t` of each of
    /// `rows` (the part's inputs, in order) to slot `slot_mapping[t]`;
    /// checks the arguments, then writes without the GIL.
    fn write_part(
        &self,
        py: Python<'_>,
        part: Part,
        layer: usize,
        rows: &[&Bound<'_, PyAny>],
        slot_mapping: &Bound<'_, PyAny>,
        stream: usize,
    ) -> PyResult<()> {
        let inputs = part
            .write_inputs(self.store.config())
            .map_err(errors::to_py)?;
        let mut descs = Vec::with_capacity(rows.len());
        let mut _tensors = Vec::with_capacity(rows.len());
        for (obj, &(name, _)) in rows.iter().zip(&inputs) {
            let (desc, tensor) = self.matrix(obj, name, &ElemType::ALL, stream, false)?;
            descs.push(desc);
            _tensors.push(tensor);
        }
        let slots = self.int_arg(
            slot_mapping,
            "slot_mapping",
            (&[Elem::I64], "int64"),
            int_arrays::slots,
            stream,
        )?;
        self.disjoint("slot_mapping", slots.desc.addr, slots.desc.len * 8)?;
        let store = &self.store;
        let desc = slots.desc;
        // SAFETY: the descriptors describe memory of the store's device kept
        // alive by `_tensors` and `slots` for this call (a GPU store's caller
        // keeps them until the stream reaches the write), checked above not to
        // overlap the store.
        py.detach(|| unsafe { store.write_part_raw(part, layer, &descs, desc, Stream(stream)) })
            .map_err(errors::to_py)
    }

    /// A gather of `part` of `num_tokens` rows through `block_table` into
    /// `out` or a new host array of `dtype` (`gather`, `gather_indexer`):
    /// checks the arguments, then gathers without the GIL. Returns the
    /// output.
    #[allow(clippy::too_many_arguments)]
    fn gather_part<'py>(
        &self,
        py: Python<'py>,
        part: Part,
        layer: usize,
        block_table: &Bound<'py, PyAny>,
        num_tokens: usize,
        dtype: Option<&str>,
        out: Option<Bound<'py, PyAny>>,
        stream: usize,
    ) -> PyResult<Bound<'py, PyAny>> {
        let width = part
            .gather_width(self.store.config())
            .map_err(errors::to_py)?;
        let elem = match dtype.map(|d| (d, Elem::parse(d))) {
            None => None,
            Some((_, Some(Elem::Float(e @ (ElemType::F32 | ElemType::Bf16))))) => Some(e),
            Some((d, _)) => {
                return Err(PyValueError::new_err(format!(
                    "dtype must be \"float32\" or \"bfloat16\", got {d:?}"
                )))
            }
        };
        let table = self.int_arg(
            block_table,
            "block_table",
            (&[Elem::I32, Elem::U32], "int32 or uint32"),
            int_arrays::block_ids,
            stream,
        )?;
        let out = match out {
            Some(out) => out,
            None if self.place() == Device::Host => {
                host_output(py, num_tokens, width, elem.unwrap_or(ElemType::F32))?
            }
            None => {
                return Err(PyValueError::new_err(
                    "a GPU store gathers into a device tensor: pass out=",
                ))
            }
        };
        let (o, _o) = self.matrix(&out, "out", &[ElemType::Bf16, ElemType::F32], stream, true)?;
        if o.rows != num_tokens {
            return Err(PyValueError::new_err(format!(
                "out has {} rows, num_tokens is {num_tokens}",
                o.rows
            )));
        }
        if elem.is_some_and(|e| e != o.elem) {
            return Err(PyValueError::new_err(format!(
                "dtype {:?} disagrees with out's {}",
                dtype.unwrap_or_default(),
                o.elem
            )));
        }
        let (desc, store) = (table.desc, &self.store);
        // SAFETY: the table and `out` are kept alive by `table` and `_o` for
        // this call, `out` checked writable and disjoint from the store.
        py.detach(|| unsafe { store.gather_part_raw(part, layer, desc, o, Stream(stream)) })
            .map_err(errors::to_py)?;
        Ok(out)
    }

    /// The indexer key width, or the error of a store without an indexer.
    fn head_dim(&self) -> PyResult<usize> {
        store::check_indexer(self.store.config())
            .map(|i| i.head_dim)
            .map_err(errors::to_py)
    }
}

/// Bytes from a matrix's first element to past its last.
fn matrix_extent(m: &MatrixDesc) -> usize {
    if m.rows == 0 || m.cols == 0 {
        0
    } else {
        (m.rows - 1)
            .saturating_mul(m.row_stride)
            .saturating_add(m.cols * m.elem.size())
    }
}

/// A new zeroed host array `[rows, cols]` of `elem` (f32, or bf16 through ml_dtypes).
fn host_output<'py>(
    py: Python<'py>,
    rows: usize,
    cols: usize,
    elem: ElemType,
) -> PyResult<Bound<'py, PyAny>> {
    match elem {
        ElemType::F32 => Ok(PyArray2::<f32>::zeros(py, [rows, cols], false).into_any()),
        _ => {
            let bf16 = py
                .import("ml_dtypes")
                .map_err(|_| {
                    PyValueError::new_err("a bfloat16 output needs the ml_dtypes package")
                })?
                .getattr("bfloat16")?;
            py.import("numpy")?
                .call_method1("zeros", ((rows, cols), bf16))
        }
    }
}

#[pymethods]
impl LatentStore {
    #[new]
    #[pyo3(signature = (config, device = "cpu", *, huge_pages = false))]
    fn new(config: Bound<'_, CacheConfig>, device: &str, huge_pages: bool) -> PyResult<Self> {
        let device = parse_device(device)?;
        let (store, blocks) = open(&config.get().0, device, huge_pages).map_err(errors::to_py)?;
        Ok(Self {
            store,
            blocks,
            config: config.unbind(),
        })
    }

    /// The configuration.
    #[getter]
    fn config(&self, py: Python<'_>) -> Py<CacheConfig> {
        self.config.clone_ref(py)
    }

    /// ``"cpu"`` or ``"cuda:N"``.
    #[getter]
    fn device(&self) -> String {
        device_name(self.store.device())
    }

    /// Quantizes and stores tokens (vLLM's ``concat_and_cache_mla``): row
    /// ``t`` of ``c_kv [T, kv_lora_rank]`` and ``k_pe [T, rope_dim]``
    /// (bfloat16, float16 or float32; rows may be strided, e.g. the two
    /// halves of one ``[T, 576]`` tensor) goes to slot ``slot_mapping[t]``
    /// (int64, ``block_id * block_size + offset``) of ``layer``; tokens with
    /// a negative slot are skipped.
    #[pyo3(signature = (layer, c_kv, k_pe, slot_mapping, *, stream = 0))]
    fn write(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = ints::size)] layer: usize,
        c_kv: &Bound<'_, PyAny>,
        k_pe: &Bound<'_, PyAny>,
        slot_mapping: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = ints::size)] stream: usize,
    ) -> PyResult<()> {
        self.write_part(py, Part::Latent, layer, &[c_kv, k_pe], slot_mapping, stream)
    }

    /// Decodes the first ``num_tokens`` tokens of a sequence whose blocks are
    /// ``block_table`` (int32) into ``[num_tokens, kv_lora_rank + rope_dim]``
    /// values: ``c_kv`` then ``k_pe`` of each token. Writes into ``out``
    /// (bfloat16 or float32, on the store's device) when given, else into a
    /// new host array of ``dtype`` (``"float32"``, the default, or
    /// ``"bfloat16"``, which needs ``ml_dtypes``). Returns the output.
    #[pyo3(signature = (layer, block_table, num_tokens, *, dtype = None, out = None, stream = 0))]
    #[allow(clippy::too_many_arguments)]
    fn gather<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = ints::size)] layer: usize,
        block_table: &Bound<'py, PyAny>,
        #[pyo3(from_py_with = ints::size)] num_tokens: usize,
        dtype: Option<&str>,
        out: Option<Bound<'py, PyAny>>,
        #[pyo3(from_py_with = ints::size)] stream: usize,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.gather_part(
            py,
            Part::Latent,
            layer,
            block_table,
            num_tokens,
            dtype,
            out,
            stream,
        )
    }

    /// Quantizes and stores DeepSeek-V3.2's indexer keys (vLLM's
    /// ``indexer_k_quant_and_cache``): row ``t`` of ``keys [T, head_dim]``
    /// (bfloat16, float16 or float32) goes to slot ``slot_mapping[t]``
    /// (int64) of ``layer``'s indexer part; negative slots are skipped.
    /// Raises ``ValueError`` when the config has no indexer.
    #[pyo3(signature = (layer, keys, slot_mapping, *, stream = 0))]
    fn write_indexer(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = ints::size)] layer: usize,
        keys: &Bound<'_, PyAny>,
        slot_mapping: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = ints::size)] stream: usize,
    ) -> PyResult<()> {
        self.write_part(py, Part::Indexer, layer, &[keys], slot_mapping, stream)
    }

    /// Dequantizes the indexer keys of the first ``num_tokens`` tokens of a
    /// sequence (``block_table``, int32) into ``[num_tokens, head_dim]``
    /// values, into ``out`` or a new host array of ``dtype``, as ``gather``.
    #[pyo3(signature = (layer, block_table, num_tokens, *, dtype = None, out = None, stream = 0))]
    #[allow(clippy::too_many_arguments)]
    fn gather_indexer<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = ints::size)] layer: usize,
        block_table: &Bound<'py, PyAny>,
        #[pyo3(from_py_with = ints::size)] num_tokens: usize,
        dtype: Option<&str>,
        out: Option<Bound<'py, PyAny>>,
        #[pyo3(from_py_with = ints::size)] stream: usize,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.gather_part(
            py,
            Part::Indexer,
            layer,
            block_table,
            num_tokens,
            dtype,
            out,
            stream,
        )
    }

    /// The stored indexer keys of the first ``num_tokens`` tokens of a
    /// sequence, not dequantized: ``(codes, scales)``, new host arrays of
    /// e4m3 codes (``uint8 [num_tokens, head_dim]``) and fp32 scales
    /// (``float32 [num_tokens]``). Host stores only; on a GPU read
    /// ``indexer_buffer`` in place.
    fn gather_indexer_quantized<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = ints::size)] layer: usize,
        block_table: &Bound<'py, PyAny>,
        #[pyo3(from_py_with = ints::size)] num_tokens: usize,
    ) -> PyResult<QuantizedKeys<'py>> {
        let head_dim = self.head_dim()?;
        if self.place() != Device::Host {
            return Err(PyValueError::new_err(
                "gather_indexer_quantized copies into host arrays: use a host store, \
                 or read indexer_buffer on the GPU",
            ));
        }
        let table = int_arrays::block_ids(block_table)?;
        let codes = PyArray2::<u8>::zeros(py, [num_tokens, head_dim], false);
        let scales = PyArray1::<f32>::zeros(py, num_tokens, false);
        {
            let mut c = codes.readwrite();
            let mut sc = scales.readwrite();
            let (c, sc) = (c.as_slice_mut()?, sc.as_slice_mut()?);
            let store = &self.store;
            let (c, sc) = (
                VectorDesc::new(c.as_mut_ptr() as usize, c.len()),
                VectorDesc::new(sc.as_mut_ptr() as usize, sc.len()),
            );
            let table = VectorDesc::from_slice(&table);
            // SAFETY: fresh arrays and an owned table, alive and unaliased
            // for the call.
            py.detach(|| unsafe {
                store.gather_indexer_quantized_raw(layer, table, c, sc, Stream::default())
            })
            .map_err(errors::to_py)?;
        }
        Ok((codes, scales))
    }

    /// Copies whole blocks ``src -> dst`` in every layer (the copies
    /// ``BlockManager.append`` returns): an iterable of ``(src, dst)`` pairs
    /// or an ``[N, 2]`` integer array. Destinations must be distinct and
    /// none may be a source.
    #[pyo3(signature = (pairs, *, stream = 0))]
    fn copy_blocks(
        &self,
        py: Python<'_>,
        pairs: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = ints::size)] stream: usize,
    ) -> PyResult<()> {
        let pairs = int_arrays::pairs(pairs)?;
        let store = &self.store;
        py.detach(|| store.copy_blocks(&pairs, Stream(stream)))
            .map_err(errors::to_py)
    }

    /// The memory of ``layer``, ``[num_blocks, block_size, bytes_per_token]``
    /// bytes: a writable numpy ``uint8`` view for a host store (no copy; it
    /// keeps the store alive), a ``LayerBuffer`` (DLPack) for a GPU store.
    fn layer_buffer<'py>(
        slf: &Bound<'py, Self>,
        #[pyo3(from_py_with = ints::size)] layer: usize,
    ) -> PyResult<Bound<'py, PyAny>> {
        let view = slf.get().store.layer_view(layer).map_err(errors::to_py)?;
        buffer(slf, view.into(), layer)
    }

    /// The indexer keys of ``layer``, ``[num_blocks, block_size, head_dim +
    /// 4]`` bytes (each block: every token's e4m3 codes, then every fp32
    /// scale), zero-copy as ``layer_buffer``: a numpy view on the host, a
    /// ``LayerBuffer`` on a GPU. Raises ``ValueError`` without an indexer.
    fn indexer_buffer<'py>(
        slf: &Bound<'py, Self>,
        #[pyo3(from_py_with = ints::size)] layer: usize,
    ) -> PyResult<Bound<'py, PyAny>> {
        let view = slf.get().store.indexer_view(layer).map_err(errors::to_py)?;
        buffer(slf, view.into(), layer)
    }

    /// The indexer keys of ``layer`` as a ``LayerBuffer`` (DLPack export and
    /// raw pointer), on any device.
    fn indexer_view(
        &self,
        #[pyo3(from_py_with = ints::size)] layer: usize,
    ) -> PyResult<LayerBuffer> {
        let view = self.store.indexer_view(layer).map_err(errors::to_py)?;
        Ok(LayerBuffer::new(
            Arc::clone(&self.store),
            view.into(),
            layer,
        ))
    }

    /// The memory of ``layer`` as a ``LayerBuffer`` (DLPack export and raw
    /// pointer), on any device.
    fn layer_view(&self, #[pyo3(from_py_with = ints::size)] layer: usize) -> PyResult<LayerBuffer> {
        let view = self.store.layer_view(layer).map_err(errors::to_py)?;
        Ok(LayerBuffer::new(
            Arc::clone(&self.store),
            view.into(),
            layer,
        ))
    }

    /// Address of the first byte of ``layer`` (host or device memory).
    fn data_ptr(&self, #[pyo3(from_py_with = ints::size)] layer: usize) -> PyResult<usize> {
        Ok(self.store.layer_view(layer).map_err(errors::to_py)?.addr)
    }

    fn __repr__(&self) -> String {
        let c = self.store.config();
        format!(
            "LatentStore(device='{}', num_layers={}, num_blocks={}, block_size={}, dtype='{}', bytes={})",
            device_name(self.store.device()),
            c.num_layers,
            c.num_blocks,
            c.block_size,
            c.dtype,
            c.total_bytes()
        )
    }
}

/// `view` of `store` as a writable numpy ``uint8`` array for a host store
/// (no copy; it keeps the store alive), a ``LayerBuffer`` for a GPU store.
fn buffer<'py>(
    store: &Bound<'py, LatentStore>,
    view: BufferView,
    layer: usize,
) -> PyResult<Bound<'py, PyAny>> {
    if view.device != Device::Host {
        let owner = Arc::clone(&store.get().store);
        return Ok(Bound::new(store.py(), LayerBuffer::new(owner, view, layer))?.into_any());
    }
    let [blocks, tokens, bytes] = view.shape;
    // SAFETY: the view is `blocks * tokens * bytes` contiguous bytes owned by
    // the store, which the array's base object (`store`) keeps alive; the
    // store never reallocates it.
    let array = unsafe {
        let data = ArrayView3::from_shape_ptr((blocks, tokens, bytes), view.addr as *const u8);
        PyArray3::<u8>::borrow_from_array(&data, store.clone().into_any())
    };
    Ok(array.into_any())
}
