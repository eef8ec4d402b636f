//! The caller's descriptors (slot mappings, block tables, matrices) read
//! back as checked slices, and rows gathered through a block table: the
//! checks every raw address passes before the host store touches it.

use super::*;

impl HostStore {
    /// The slots of a checked `slot_mapping`, each negative or in range.
    ///
    /// # Safety
    /// `slot_mapping` passed `VectorDesc::check` and is readable for the
    /// returned slice's lifetime.
    pub(super) unsafe fn checked_slots<'a>(
        &self,
        slot_mapping: &VectorDesc<i64>,
    ) -> Result<&'a [i64]> {
        let slots: &[i64] = if slot_mapping.len == 0 {
            &[]
        } else {
            // SAFETY: checked non-null and aligned; readable per the contract.
            unsafe { std::slice::from_raw_parts(slot_mapping.addr as *const i64, slot_mapping.len) }
        };
        let capacity = self.config.num_tokens();
        if let Some((t, &slot)) = slots
            .iter()
            .enumerate()
            .find(|&(_, &s)| s >= 0 && s as u64 >= capacity as u64)
        {
            return Err(Error::InvalidArgument(format!(
                "slot_mapping[{t}] = {slot} out of range (num_blocks x block_size = {capacity})"
            )));
        }
        Ok(slots)
    }

    /// The first `blocks` entries of a checked `block_table`, each a valid id.
    ///
    /// # Safety
    /// `block_table` passed `VectorDesc::check`, has at least `blocks`
    /// entries and is readable for the returned slice's lifetime.
    pub(super) unsafe fn checked_table<'a>(
        &self,
        block_table: &VectorDesc<BlockId>,
        blocks: usize,
    ) -> Result<&'a [BlockId]> {
        if blocks == 0 {
            return Ok(&[]);
        }
        // SAFETY: checked non-null and aligned, `blocks <= len`; readable per
        // the contract.
        let table =
            unsafe { std::slice::from_raw_parts(block_table.addr as *const BlockId, blocks) };
        for &block in table {
            check_block(&self.config, block)?;
        }
        Ok(table)
    }

    /// Decodes `part` of `out.rows` tokens through a checked block table.
    ///
    /// # Safety
    /// `out` was checked by `check_gather_args`, holds `O`, and is writable
    /// and unaliased for the call.
    pub(super) unsafe fn gather_rows<O: Decoded>(
        &self,
        part: Part,
        layer: usize,
        table: &[BlockId],
        out: &MatrixDesc,
    ) {
        let (bs, bpt) = (self.config.block_size, self.codec.bytes_per_token());
        let _guard = self.layers[layer].read();
        // SAFETY: the layer's read lock is held until the end of the scope.
        let memory = unsafe { self.part_slice(part, layer) };
        for t in 0..out.rows {
            // SAFETY: row `t` lies within the checked extent of `out`.
            let row = unsafe {
                std::slice::from_raw_parts_mut((out.addr + t * out.row_stride) as *mut O, out.cols)
            };
            let (block, offset) = (table[t / bs], t % bs);
            match (part, self.indexer) {
                (Part::Latent, _) => {
                    let slot = block as usize * bs + offset;
                    self.codec
                        .decode_unchecked(&memory[slot * bpt..(slot + 1) * bpt], row);
                }
                (Part::Indexer, Some(codec)) => {
                    codec.decode_unchecked(indexer_block(memory, &codec, block), offset, row);
                }
                // Unreachable: the args check needs an indexer.
                (Part::Indexer, None) => {}
            }
        }
    }
}

/// Describes a contiguous `[rows, cols]` slice, checking its length.
pub(super) fn matrix_of(
    values: Values<'_>,
    name: &str,
    rows: usize,
    cols: usize,
) -> Result<MatrixDesc> {
    let addr = match values {
        Values::Bf16(s) => s.as_ptr() as usize,
        Values::F16(s) => s.as_ptr() as usize,
        Values::F32(s) => s.as_ptr() as usize,
    };
    if Some(values.len()) != rows.checked_mul(cols) {
        return Err(Error::InvalidArgument(format!(
            "{name}: {} values, expected {rows} x {cols}",
            values.len()
        )));
    }
    Ok(MatrixDesc::contiguous(addr, values.elem_type(), rows, cols))
}
