//! Growth: generated tokens appended and room reserved, the table growing
//! by fresh blocks and a shared partial tail copied on write.

use super::*;

impl BlockManager {
    /// Appends generated `tokens` to request `id`. Fills the reserved room
    /// first and takes new blocks only when it is full; a shared partial tail
    /// is first copied to a fresh block (see [`AppendOutcome::copies`]).
    /// Blocks that become full (and computed) are hashed and shareable.
    pub fn append(&self, id: RequestId, tokens: &[TokenId]) -> Result<AppendOutcome> {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        let request = st.requests.get_mut(&id).ok_or(Error::UnknownRequest(id))?;
        self.append_to(&mut st.pool, &mut st.cache, request, tokens)
    }

    /// [`BlockManager::append`] of `tokens` to `request`, under the lock.
    pub(super) fn append_to(
        &self,
        pool: &mut Pool,
        cache: &mut CacheState,
        request: &mut Request,
        tokens: &[TokenId],
    ) -> Result<AppendOutcome> {
        let new_len = appended_len(request, tokens)?;
        let outcome = self.make_room(pool, cache, request, new_len)?;
        if request.tokens.len() == request.len {
            request.tokens.extend_from_slice(tokens);
        }
        request.len = new_len;
        if !request.chunked {
            request.num_computed = new_len;
            let first = request.chain.hashes.len();
            self.index_blocks(cache, request, first);
        }
        Ok(outcome)
    }

    /// Tokens request `id` can take before it needs a new block: the room
    /// left in its table (its partial tail and reserved blocks).
    pub fn capacity(&self, id: RequestId) -> Result<usize> {
        let st = self.state.lock();
        let request = st.requests.get(&id).ok_or(Error::UnknownRequest(id))?;
        Ok(request.blocks.len() * self.config.block_size - request.len)
    }

    /// Grows request `id`'s table so it has room for `total_slots` token
    /// positions (its tokens included) without adding tokens: lookahead
    /// slots for speculative decoding (vLLM's `num_lookahead_tokens`, draft
    /// tokens of DeepSeek's multi-token prediction), addressed with
    /// [`BlockManager::slot_mapping`]. Never shrinks: with the room already
    /// there it adds nothing. The room is private: when it starts inside a
    /// partial tail shared with a fork, that tail is copied first (see
    /// [`AppendOutcome::copies`]), so the slots can be written at once.
    ///
    /// Returns the blocks added to the end of the table and the copies, as
    /// [`BlockManager::append`] does. A later `append` fills the reserved
    /// room before taking blocks; `fork` shares only the blocks holding
    /// tokens; `free` releases the room with the rest. All or nothing:
    /// [`Error::OutOfBlocks`] (fits later) or [`Error::RequestTooLarge`]
    /// (never fits) change nothing.
    pub fn reserve(&self, id: RequestId, total_slots: usize) -> Result<AppendOutcome> {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        let request = st.requests.get_mut(&id).ok_or(Error::UnknownRequest(id))?;
        self.make_room(&mut st.pool, &mut st.cache, request, total_slots)
    }

    /// Grows `request`'s table to room for `slots` positions, first copying
    /// a shared partial tail that positions past its tokens would be
    /// written into. All or nothing.
    pub(super) fn make_room(
        &self,
        pool: &mut Pool,
        cache: &mut CacheState,
        request: &mut Request,
        slots: usize,
    ) -> Result<AppendOutcome> {
        let growth = self.growth(request, slots)?;
        let grow = growth.grow;
        let cow = growth
            .written_tail
            .is_some_and(|(_, b)| pool.ref_count(b) > 1);
        let fresh = grow + usize::from(cow);
        let available = pool.num_free(cache);
        if fresh > available {
            return Err(Error::OutOfBlocks {
                needed: fresh,
                available,
            });
        }
        let mut outcome = AppendOutcome::default();
        if let Some((position, src)) = growth.written_tail.filter(|_| cow) {
            let dst = pool.allocate(&self.prefixes, cache);
            pool.release(cache, src);
            request.blocks[position] = dst;
            cache.stats.cow_copies += 1;
            outcome.copies.push(BlockCopy { src, dst, position });
        }
        let start = request.blocks.len();
        pool.allocate_many(&self.prefixes, cache, grow, &mut request.blocks);
        outcome.new_block_ids = request.blocks[start..].to_vec();
        Ok(outcome)
    }

    /// How `request`'s table grows to room for `slots` positions: fails
    /// with [`Error::RequestTooLarge`] past the cache's size.
    pub(super) fn growth(&self, request: &Request, slots: usize) -> Result<Growth> {
        let bs = self.config.block_size;
        let needed = self.blocks_for(slots);
        if needed > self.config.num_blocks {
            return Err(Error::RequestTooLarge {
                needed,
                total: self.config.num_blocks,
            });
        }
        let len = request.len;
        let tail = len / bs;
        Ok(Growth {
            grow: needed.saturating_sub(request.blocks.len()),
            written_tail: (slots > len && len % bs != 0).then(|| (tail, request.blocks[tail])),
        })
    }
}

/// How a request's table grows ([`BlockManager::growth`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct Growth {
    /// Blocks added to the end of the table.
    pub(super) grow: usize,
    /// The partial tail (table position, block) that positions past the
    /// tokens are written into: copied first when shared.
    pub(super) written_tail: Option<(usize, BlockId)>,
}

/// The length of `request` once `tokens` are appended.
pub(super) fn appended_len(request: &Request, tokens: &[TokenId]) -> Result<usize> {
    if tokens.is_empty() {
        return Err(Error::EmptyInput("append needs at least one token"));
    }
    request
        .len
        .checked_add(tokens.len())
        .ok_or_else(|| Error::InvalidArgument("sequence length overflows".into()))
}
