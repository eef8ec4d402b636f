//! `ExtraKeys` and `MultiModalKey`: what besides token ids decides whether
//! two requests may share cached blocks.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyTuple};

use super::ints;

/// A multimodal input (an image, say) whose placeholder tokens occupy
/// ``offset .. offset + length`` of the prompt. Its content ``hash`` (any
/// string, e.g. a hex digest; bytes are hex-encoded) enters the hash of every
/// block those tokens overlap, so two prompts with equal placeholder tokens
/// but different images never share those blocks.
#[pyclass(frozen, eq, module = "mla_cache")]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MultiModalKey(pub(crate) mla_cache::MultiModalKey);

#[pymethods]
impl MultiModalKey {
    #[new]
    #[pyo3(signature = (hash, offset, length))]
    fn new(
        hash: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = ints::size)] offset: usize,
        #[pyo3(from_py_with = ints::size)] length: usize,
    ) -> PyResult<Self> {
        let hash = if let Ok(b) = hash.cast::<PyBytes>() {
            b.as_bytes().iter().map(|x| format!("{x:02x}")).collect()
        } else {
            hash.extract::<String>()
                .map_err(|_| PyTypeError::new_err("a multimodal hash must be a str or bytes"))?
        };
        Ok(Self(mla_cache::MultiModalKey {
            hash,
            offset,
            length,
        }))
    }

    /// Content hash of the input.
    #[getter]
    fn hash(&self) -> &str {
        &self.0.hash
    }

    /// First placeholder token.
    #[getter]
    fn offset(&self) -> usize {
        self.0.offset
    }

    /// Number of placeholder tokens.
    #[getter]
    fn length(&self) -> usize {
        self.0.length
    }

    fn __repr__(&self) -> String {
        let m = &self.0;
        format!(
            "MultiModalKey(hash={:?}, offset={}, length={})",
            m.hash, m.offset, m.length
        )
    }
}

impl MultiModalKey {
    /// A `MultiModalKey` or a `(hash, offset, length)` tuple.
    fn extract(obj: &Bound<'_, PyAny>) -> PyResult<mla_cache::MultiModalKey> {
        if let Ok(k) = obj.cast::<MultiModalKey>() {
            return Ok(k.get().0.clone());
        }
        if let Ok(t) = obj.cast::<PyTuple>() {
            if t.len() == 3 {
                let (h, o, l) = (t.get_item(0)?, t.get_item(1)?, t.get_item(2)?);
                return Ok(Self::new(&h, ints::size(&o)?, ints::size(&l)?)?.0);
            }
        }
        Err(PyTypeError::new_err(
            "a multimodal key must be a MultiModalKey or a (hash, offset, length) tuple",
        ))
    }
}

/// Keys beyond the token ids that decide whether two blocks may be shared.
///
/// - ``adapter``: the LoRA adapter (or any model variant) the KV was computed
///   with; enters every block.
/// - ``salt``: a cache salt for tenant isolation; enters the first block and,
///   by chaining, every later one: two salts never share a block.
/// - ``mm``: multimodal inputs, each a ``MultiModalKey`` or a
///   ``(hash, offset, length)`` tuple.
/// - ``adapter_path``: the adapter's path, part of vLLM's LoRA key under an
///   engine-compatible ``block_hash`` (ignored by the default hash).
///
/// Wherever a method takes ``extra_keys``, it accepts an ``ExtraKeys``, a
/// dict with some of the keys ``"adapter"``, ``"salt"``, ``"mm"`` and
/// ``"adapter_path"``, or
/// ``None``.
#[pyclass(frozen, eq, module = "mla_cache")]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtraKeys(pub(crate) mla_cache::ExtraKeys);

#[pymethods]
impl ExtraKeys {
    #[new]
    #[pyo3(signature = (*, adapter=None, salt=None, mm=None, adapter_path=None))]
    fn new(
        adapter: Option<String>,
        salt: Option<String>,
        mm: Option<&Bound<'_, PyAny>>,
        adapter_path: Option<String>,
    ) -> PyResult<Self> {
        let mm = match mm {
            None => Vec::new(),
            Some(seq) => seq
                .try_iter()?
                .map(|item| MultiModalKey::extract(&item?))
                .collect::<PyResult<_>>()?,
        };
        Ok(Self(mla_cache::ExtraKeys {
            adapter,
            salt,
            mm,
            adapter_path,
        }))
    }

    /// The adapter name, or ``None``.
    #[getter]
    fn adapter(&self) -> Option<&str> {
        self.0.adapter.as_deref()
    }

    /// The adapter's path, or ``None``.
    #[getter]
    fn adapter_path(&self) -> Option<&str> {
        self.0.adapter_path.as_deref()
    }

    /// The cache salt, or ``None``.
    #[getter]
    fn salt(&self) -> Option<&str> {
        self.0.salt.as_deref()
    }

    /// The multimodal inputs, as a tuple of ``MultiModalKey``.
    #[getter]
    fn mm<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.0.mm.iter().cloned().map(MultiModalKey))
    }

    fn __repr__(&self) -> String {
        let k = &self.0;
        let mm: Vec<String> =
            k.mm.iter()
                .map(|m| MultiModalKey(m.clone()).__repr__())
                .collect();
        format!(
            "ExtraKeys(adapter={}, salt={}, mm=({}{}){})",
            opt_repr(&k.adapter),
            opt_repr(&k.salt),
            mm.join(", "),
            if mm.len() == 1 { "," } else { "" },
            k.adapter_path
                .as_ref()
                .map_or_else(String::new, |p| format!(", adapter_path={p:?}"))
        )
    }
}

fn opt_repr(s: &Option<String>) -> String {
    s.as_ref()
        .map_or_else(|| "None".into(), |s| format!("{s:?}"))
}

/// Reads the `extra_keys` and `salt` arguments of a manager method; a salt
/// given both ways must agree.
pub(crate) fn extract(
    extra_keys: Option<&Bound<'_, PyAny>>,
    salt: Option<String>,
) -> PyResult<mla_cache::ExtraKeys> {
    let mut keys = match extra_keys {
        None => mla_cache::ExtraKeys::default(),
        Some(obj) if obj.is_none() => mla_cache::ExtraKeys::default(),
        Some(obj) => {
            if let Ok(k) = obj.cast::<ExtraKeys>() {
                k.get().0.clone()
            } else if let Ok(d) = obj.cast::<PyDict>() {
                from_dict(d)?
            } else {
                return Err(PyTypeError::new_err(format!(
                    "extra_keys must be an ExtraKeys, a dict or None, got {}",
                    obj.get_type().name()?
                )));
            }
        }
    };
    if let Some(s) = salt {
        match &keys.salt {
            Some(other) if *other != s => {
                return Err(PyValueError::new_err(format!(
                    "salt {s:?} disagrees with extra_keys' salt {other:?}"
                )))
            }
            _ => keys.salt = Some(s),
        }
    }
    Ok(keys)
}

fn from_dict(d: &Bound<'_, PyDict>) -> PyResult<mla_cache::ExtraKeys> {
    let mut adapter = None;
    let mut salt = None;
    let mut mm = None;
    let mut adapter_path = None;
    for (k, v) in d.iter() {
        let name: String = k
            .extract()
            .map_err(|_| PyTypeError::new_err("extra_keys' keys must be str"))?;
        let v = (!v.is_none()).then_some(v);
        match name.as_str() {
            "adapter" => adapter = v.map(|v| v.extract()).transpose()?,
            "salt" => salt = v.map(|v| v.extract()).transpose()?,
            "mm" => mm = v,
            "adapter_path" => adapter_path = v.map(|v| v.extract()).transpose()?,
            other => {
                return Err(PyValueError::new_err(format!(
                    "unknown extra key {other:?} (expected adapter, salt, mm or adapter_path)"
                )))
            }
        }
    }
    Ok(ExtraKeys::new(adapter, salt, mm.as_ref(), adapter_path)?.0)
}
