//! Admission: a prompt checked, hashed (or keyed by the engine's hashes),
//! looked up in the prefix index and given its blocks, all or nothing; and
//! the lookups that admit nothing (`would_admit`, `match_prefix`).

use super::*;

impl BlockManager {
    /// Hashes of the full blocks of `tokens` under `keys` (none without prefix caching).
    pub(super) fn chain(&self, tokens: &[TokenId], keys: &ExtraKeys) -> Vec<BlockHash> {
        self.prefixes
            .chain(tokens, &self.prefixes.hasher.digest(keys))
    }

    /// Admits request `id` with its prompt `tokens`, reusing the longest
    /// cached prefix (capped at `len - 1` tokens by default) and reserving
    /// `opts.decode_slots` more slots. All or nothing: it holds exactly
    /// `ceil((len + decode_slots) / block_size)` blocks, or fails with
    /// [`Error::OutOfBlocks`] (fits later) or [`Error::RequestTooLarge`]
    /// (never fits) and changes nothing.
    pub fn admit(
        &self,
        id: RequestId,
        tokens: &[TokenId],
        opts: &AdmitOptions,
    ) -> Result<Admission> {
        // The request keeps a copy of its tokens: made as the chain is
        // hashed, it is also the buffer the chain is hashed in.
        self.admit_filled(
            id,
            tokens.len(),
            &mut |out, upto| {
                fill_step(tokens, out, upto, |step, out| {
                    out.extend_from_slice(step);
                    Ok(())
                })
            },
            opts,
        )
    }

    /// [`BlockManager::admit`] of a prompt of `len` tokens that `fill`
    /// writes into the request's buffer block by block as they are hashed
    /// (`fill(tokens, upto)` appends them up to `upto`): a caller converting its prompt (the
    /// bindings' arrays) converts it there, and an error of `fill` (a value
    /// out of range) fails the call before anything changes.
    pub fn admit_filled(
        &self,
        id: RequestId,
        len: usize,
        fill: &mut dyn FnMut(&mut Vec<TokenId>, usize) -> Result<()>,
        opts: &AdmitOptions,
    ) -> Result<Admission> {
        let (needed, keys) = self.check_prompt(len, opts)?;
        let (tokens, chain) = self.prefixes.chain_filling(len, &keys, fill)?;
        let prompt = self.prompt(len, keys, chain, needed);
        self.admit_checked(id, Cow::Owned(tokens), opts, Cow::Owned(prompt))
    }

    /// [`BlockManager::admit`] of a prompt the caller owns: its tokens are
    /// hashed in place and move into the request instead of being copied.
    pub fn admit_owned(
        &self,
        id: RequestId,
        mut tokens: Vec<TokenId>,
        opts: &AdmitOptions,
    ) -> Result<Admission> {
        let (needed, keys) = self.check_prompt(tokens.len(), opts)?;
        let chain = self.prefixes.chain_in_place(&mut tokens, &keys);
        let prompt = self.prompt(tokens.len(), keys, chain, needed);
        self.admit_checked(id, Cow::Owned(tokens), opts, Cow::Owned(prompt))
    }

    /// [`BlockManager::admit`] keyed by the caller's block hashes: `hashes`
    /// names the full blocks of `tokens`, one each, as the engine hashed
    /// them ([`BlockManager::engine_block_hash`] of vLLM's digests), and the
    /// manager never hashes this request's tokens. The lookup reads them
    /// all; what is indexed at once is the hit under chunked prefill, else
    /// every full block. Later blocks are indexed by
    /// [`BlockManager::commit_hashed`] with their hashes (from the first one
    /// not indexed); `append` and `commit` leave them unindexed.
    ///
    /// Caller hashes and the manager's own share one index, so they must
    /// name equal prefixes alike: they are taken only under an
    /// engine-compatible [`CacheConfig::block_hash`] (`sha256_cbor`,
    /// `xxhash_cbor`), whose chain the manager computes as vLLM does, and
    /// without `verify_tokens`; otherwise, and for a count other than
    /// `tokens.len() / block_size`, [`Error::InvalidArgument`] and nothing
    /// changes.
    pub fn admit_hashed(
        &self,
        id: RequestId,
        tokens: &[TokenId],
        hashes: &[BlockHash],
        opts: &AdmitOptions,
    ) -> Result<Admission> {
        self.check_caller_hashes()?;
        let full = tokens.len() / self.config.block_size;
        if hashes.len() != full {
            return Err(Error::InvalidArgument(format!(
                "{} block hashes for {full} full blocks",
                hashes.len()
            )));
        }
        let mut prompt = self.prepare_keyed(tokens, opts, Some(hashes))?;
        prompt.caller_hashed = true;
        self.admit_checked(id, Cow::Borrowed(tokens), opts, Cow::Owned(prompt))
    }

    /// The manager's name for one block digest of the engine's hasher
    /// (vLLM's `request.block_hashes` entries): its last 16 bytes,
    /// big-endian, as the manager derives its own `sha256_cbor` and
    /// `xxhash_cbor` hashes, so events carry vLLM's external hashes. The
    /// digest is 32 bytes under `sha256_cbor`, 16 under `xxhash_cbor`;
    /// [`Error::InvalidArgument`] for another length or under `xxh3`.
    pub fn engine_block_hash(&self, digest: &[u8]) -> Result<BlockHash> {
        self.check_caller_hashes()?;
        let want = match self.config.block_hash {
            BlockHashKind::Sha256Cbor => 32,
            _ => 16,
        };
        if digest.len() != want {
            return Err(Error::InvalidArgument(format!(
                "a {} block digest has {want} bytes, got {}",
                self.config.block_hash.name(),
                digest.len()
            )));
        }
        let tail: [u8; 16] = digest[want - 16..].try_into().expect("16 bytes");
        Ok(BlockHash(u128::from_be_bytes(tail)))
    }

    /// Refuses caller hashes where they could not equal the manager's own.
    pub(super) fn check_caller_hashes(&self) -> Result<()> {
        if self.config.block_hash == BlockHashKind::Xxh3 {
            return Err(Error::InvalidArgument(
                "caller block hashes need block_hash 'sha256_cbor' or 'xxhash_cbor' \
                 (the 'xxh3' chain is the library's own, unlike any engine's)"
                    .into(),
            ));
        }
        if self.config.verify_tokens {
            return Err(Error::InvalidArgument(
                "caller block hashes cannot be used with verify_tokens".into(),
            ));
        }
        Ok(())
    }

    /// Checks a prompt and computes, before the state lock is taken, what
    /// admitting it needs: its key digest, its chain and its hit cap.
    pub(crate) fn prepare(&self, tokens: &[TokenId], opts: &AdmitOptions) -> Result<Prompt> {
        self.prepare_keyed(tokens, opts, None)
    }

    /// [`BlockManager::prepare`] with the chain `hashes` when the caller gives it.
    pub(super) fn prepare_keyed(
        &self,
        tokens: &[TokenId],
        opts: &AdmitOptions,
        hashes: Option<&[BlockHash]>,
    ) -> Result<Prompt> {
        let (needed, keys) = self.check_prompt(tokens.len(), opts)?;
        let chain = match hashes {
            Some(h) if self.config.enable_prefix_caching => Chain::from_hashes(h.to_vec()),
            Some(_) => Chain::default(),
            None => self.prefixes.chain_of(tokens, &keys),
        };
        Ok(self.prompt(tokens.len(), keys, chain, needed))
    }

    /// Checks a prompt of `len` tokens under `opts`: the blocks it needs
    /// and its key digest.
    pub(super) fn check_prompt(
        &self,
        len: usize,
        opts: &AdmitOptions,
    ) -> Result<(usize, KeyDigest)> {
        if len == 0 {
            return Err(Error::EmptyInput(
                "a request needs at least one prompt token",
            ));
        }
        let slots = len
            .checked_add(opts.decode_slots)
            .ok_or_else(|| Error::InvalidArgument("prompt + decode slots overflow".into()))?;
        let needed = self.blocks_for(slots);
        if needed > self.config.num_blocks {
            return Err(Error::RequestTooLarge {
                needed,
                total: self.config.num_blocks,
            });
        }
        opts.keys.check(len)?;
        Ok((needed, self.prefixes.hasher.digest(&opts.keys)))
    }

    /// The checked prompt of `len` tokens with its `chain`.
    pub(super) fn prompt(
        &self,
        len: usize,
        keys: KeyDigest,
        chain: Chain,
        needed: usize,
    ) -> Prompt {
        let hit_limit = if self.config.cap_hit_at_last_token {
            (len - 1) / self.config.block_size
        } else {
            chain.hashes.len()
        };
        Prompt {
            keys: Arc::new(keys),
            chain,
            hit_limit,
            needed,
            caller_hashed: false,
        }
    }

    /// [`BlockManager::admit`] of a prompt that [`BlockManager::prepare`]
    /// computed with the same `tokens` and `opts`.
    pub(crate) fn admit_prepared(
        &self,
        id: RequestId,
        tokens: &[TokenId],
        opts: &AdmitOptions,
        prompt: &Prompt,
    ) -> Result<Admission> {
        self.admit_checked(id, Cow::Borrowed(tokens), opts, Cow::Borrowed(prompt))
    }

    /// The admission itself: an owned prompt's chain and tokens move into
    /// the request, a borrowed one's are copied (the chain only as far as
    /// it is kept).
    pub(super) fn admit_checked(
        &self,
        id: RequestId,
        tokens: Cow<'_, [TokenId]>,
        opts: &AdmitOptions,
        prompt: Cow<'_, Prompt>,
    ) -> Result<Admission> {
        let (hashes, needed, bs) = (&prompt.chain.hashes, prompt.needed, self.config.block_size);
        let len = tokens.len();
        let mut guard = self.state.lock();
        let st = &mut *guard;
        if st.requests.contains_key(&id) {
            return Err(Error::DuplicateRequest(id));
        }
        // The hits start the block table.
        let (mut blocks, check) = self.check_admit(st, &tokens, &prompt);
        if !check.fits() {
            return Err(Error::OutOfBlocks {
                needed: check.new_blocks,
                available: check.available_blocks,
            });
        }
        let (fresh, num_hits) = (check.new_blocks, blocks.len());

        let retention = st.cache.policy.on_request(hashes, num_hits);
        for &b in &blocks {
            st.pool.acquire(&mut st.cache, b);
            st.cache.policy.on_hit(b);
        }
        blocks.reserve_exact(needed - num_hits);
        st.pool
            .allocate_many(&self.prefixes, &mut st.cache, fresh, &mut blocks);
        let cached = num_hits * bs;
        let stats = &mut st.cache.stats;
        stats.prefix_query_tokens += len as u64;
        stats.prefix_hit_tokens += cached as u64;
        stats.prefix_query_requests += 1;
        stats.prefix_hit_requests += u64::from(cached > 0);
        stats.num_requests += 1;

        let num_computed = if opts.chunked_prefill { cached } else { len };
        // The precomputed chain is kept only up to what is hashed and indexed below.
        let (kept, keys, caller_hashed) = (
            num_computed / bs,
            Arc::clone(&prompt.keys),
            prompt.caller_hashed,
        );
        let chain = match prompt {
            Cow::Owned(mut p) => {
                p.chain.truncate(kept);
                p.chain
            }
            Cow::Borrowed(p) => p.chain.prefix(kept),
        };
        let mut request = Request {
            tokens: tokens.into_owned(),
            len,
            blocks,
            chain,
            num_computed,
            chunked: opts.chunked_prefill,
            retention,
            keys,
            caller_hashed,
        };
        self.index_blocks(&mut st.cache, &mut request, 0);
        let admission = Admission {
            block_ids: request.blocks.clone(),
            num_cached_tokens: cached,
        };
        st.requests.insert(id, request);
        Ok(admission)
    }

    /// The hits of `prompt` and what admitting it takes now, changing nothing.
    pub(super) fn check_admit(
        &self,
        st: &State,
        tokens: &[TokenId],
        prompt: &Prompt,
    ) -> (Vec<BlockId>, AdmitCheck) {
        let hits = self
            .prefixes
            .lookup(tokens, &prompt.chain.hashes, prompt.hit_limit);
        let reviving = hits.iter().filter(|&&b| st.cache.is_evictable(b)).count();
        let check = AdmitCheck {
            num_cached_tokens: hits.len() * self.config.block_size,
            new_blocks: prompt.needed - hits.len(),
            available_blocks: st.pool.num_free(&st.cache) - reviving,
        };
        (hits, check)
    }

    /// What [`BlockManager::admit`] of `tokens` with `opts` would take now
    /// (hit tokens, blocks to allocate, blocks available), without admitting
    /// anything, taking references or telling the policy: a dry run. Fails
    /// as `admit` does for input it refuses ([`Error::EmptyInput`],
    /// [`Error::RequestTooLarge`]); [`AdmitCheck::fits`] says whether it
    /// would fail with [`Error::OutOfBlocks`].
    pub fn would_admit(&self, tokens: &[TokenId], opts: &AdmitOptions) -> Result<AdmitCheck> {
        let prompt = self.prepare(tokens, opts)?;
        let st = self.state.lock();
        Ok(self.check_admit(&st, tokens, &prompt).1)
    }

    /// Longest cached prefix of `tokens` under `keys`, without admitting
    /// anything or taking references: the blocks may be evicted right after.
    pub fn match_prefix(&self, tokens: &[TokenId], keys: &ExtraKeys) -> PrefixMatch {
        let block_ids = self.cached_run(tokens, &self.chain(tokens, keys));
        PrefixMatch {
            num_tokens: block_ids.len() * self.config.block_size,
            block_ids,
        }
    }

    /// Longest cached prefix named by the caller's block hashes (see
    /// [`BlockManager::admit_hashed`]), without admitting anything or taking
    /// references. Needs no tokens, and reads `hashes` only up to the first
    /// miss: [`Error::InvalidArgument`] where caller hashes are refused.
    pub fn match_hashes(&self, hashes: impl IntoIterator<Item = BlockHash>) -> Result<PrefixMatch> {
        self.check_caller_hashes()?;
        let block_ids = if self.config.enable_prefix_caching {
            let keys = hashes.into_iter().map(|h| (h, None));
            self.prefixes.index.leading_run(keys, &[])
        } else {
            Vec::new()
        };
        Ok(PrefixMatch {
            num_tokens: block_ids.len() * self.config.block_size,
            block_ids,
        })
    }

    /// The cached leading blocks of `tokens`, whose chain is `hashes`.
    pub(crate) fn cached_run(&self, tokens: &[TokenId], hashes: &[BlockHash]) -> Vec<BlockId> {
        self.prefixes.lookup(tokens, hashes, usize::MAX)
    }
}
