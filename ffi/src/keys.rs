//! A request's keys and admission options as C passes them (extra keys,
//! multimodal inputs, decode slots, chunked prefill), converted and checked.

use std::ffi::c_char;

use super::{input, opt_text, FfiResult};
use mla_cache::{AdmitOptions, ExtraKeys, MultiModalKey};

/// A multimodal input whose placeholder tokens occupy
/// `offset .. offset + length` of the prompt.
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub struct MlaMultiModalKey {
    /// Content hash of the input (any NUL-terminated string); required.
    pub hash: *const c_char,
    /// First placeholder token.
    pub offset: usize,
    /// Number of placeholder tokens.
    pub length: usize,
}

/// Keys beyond the token ids that decide whether blocks may be shared.
/// All-zero (NULL pointers, no inputs) means none.
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub struct MlaExtraKeys {
    /// LoRA adapter (or model variant) name, or NULL; enters every block.
    pub adapter: *const c_char,
    /// The adapter's path, or NULL (`""`): part of vLLM's LoRA key under the
    /// vLLM-compatible hashes (`MLA_BLOCK_HASH_KIND_SHA256_CBOR`,
    /// `MLA_BLOCK_HASH_KIND_XXHASH_CBOR`), so that their hashes equal vLLM's;
    /// the library's own hash ignores it. Used only with `adapter`.
    pub adapter_path: *const c_char,
    /// Cache salt for tenant isolation, or NULL; enters the first block (and so all).
    pub salt: *const c_char,
    /// Multimodal inputs (`num_mm` of them; may be NULL when `num_mm` is 0).
    pub mm: *const MlaMultiModalKey,
    /// Number of multimodal inputs.
    pub num_mm: usize,
}

/// How a request is admitted. All-zero means the defaults (no decode
/// slots, no extra keys, unchunked prefill).
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub struct MlaAdmitOptions {
    /// Token slots reserved beyond the prompt, for decoding.
    pub decode_slots: usize,
    /// Extra keys (adapter, salt, multimodal inputs).
    pub keys: MlaExtraKeys,
    /// The prompt is computed in chunks, reported with `mla_manager_commit`;
    /// until then its uncomputed blocks are not shared. When false the whole
    /// prompt, and every appended token, counts as computed at once.
    ///
    /// Warning: when false, the prompt's blocks are shared from admission
    /// on, before their latents are written; a request admitted by another
    /// thread before the prefill ran reads unwritten KV. Multi-threaded
    /// engines set this and commit the tokens once written.
    pub chunked_prefill: bool,
}

/// Converts optional C extra keys.
///
/// # Safety
/// A non-null `keys` must point to a valid `MlaExtraKeys` whose strings and
/// array are valid.
pub(crate) unsafe fn extra_keys(keys: *const MlaExtraKeys) -> FfiResult<ExtraKeys> {
    // SAFETY: per the contract.
    let Some(k) = (unsafe { keys.as_ref() }) else {
        return Ok(ExtraKeys::default());
    };
    // SAFETY: per the contract.
    let mm = unsafe { input(k.mm, k.num_mm, "keys.mm") }?
        .iter()
        .map(|m| {
            Ok(MultiModalKey {
                // SAFETY: per the contract.
                hash: unsafe { super::text(m.hash, "keys.mm[].hash") }?.to_owned(),
                offset: m.offset,
                length: m.length,
            })
        })
        .collect::<FfiResult<Vec<_>>>()?;
    Ok(ExtraKeys {
        // SAFETY: per the contract.
        adapter: unsafe { opt_text(k.adapter, "keys.adapter") }?.map(str::to_owned),
        // SAFETY: per the contract.
        salt: unsafe { opt_text(k.salt, "keys.salt") }?.map(str::to_owned),
        mm,
        // SAFETY: per the contract.
        adapter_path: unsafe { opt_text(k.adapter_path, "keys.adapter_path") }?.map(str::to_owned),
    })
}

/// Converts optional C admission options (NULL: the defaults).
///
/// # Safety
/// A non-null `options` must point to valid `MlaAdmitOptions` (with valid
/// strings and arrays).
pub(crate) unsafe fn admit_options(options: *const MlaAdmitOptions) -> FfiResult<AdmitOptions> {
    // SAFETY: per the contract.
    Ok(match unsafe { options.as_ref() } {
        None => AdmitOptions::default(),
        Some(o) => AdmitOptions {
            decode_slots: o.decode_slots,
            // SAFETY: per the contract.
            keys: unsafe { extra_keys(&o.keys) }?,
            chunked_prefill: o.chunked_prefill,
        },
    })
}
