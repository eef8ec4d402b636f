//! A synthetic multi-turn chat workload with shared system prompts.
//!
//! Conversations start as a Poisson process. Each picks one of a few system
//! prompts (uniformly), then runs several turns: every turn's prompt is the
//! whole conversation so far (system prompt, earlier user messages and
//! answers) plus a new user message. Turns of one conversation arrive a
//! uniformly drawn gap apart.
//!
//! The workload is expressed as a Mooncake trace (see [`super::trace`]):
//! system prompts are whole 512-token hash blocks, shared by every
//! conversation that uses them; a conversation's own blocks get fresh hash
//! ids, and a block that a later turn extends keeps its id (its earlier
//! tokens are unchanged). With the trace's token rule the answer tokens that
//! fall inside the prompt's last block are exactly the tokens the next turn
//! sends, so follow-ups also hit blocks filled during decode.
//!
//! Everything derives from [`ChatConfig`] and the seed through
//! SplitMix64, so a seed names one workload on every platform.

use super::rng::SplitMix64;
use super::trace::{Trace, TraceRequest, HASH_BLOCK_TOKENS};

/// Shape of the chat workload. Ranges are inclusive.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatConfig {
    /// Conversations to generate.
    pub conversations: usize,
    /// Distinct system prompts shared between conversations.
    pub system_prompts: usize,
    /// System prompt length in 512-token blocks.
    pub system_prompt_blocks: (u64, u64),
    /// Tokens of a private context (a document, a repository) sent with the
    /// first message only; `(0, 0)` for plain chat.
    pub context_tokens: (u64, u64),
    /// Turns per conversation.
    pub turns: (u64, u64),
    /// Tokens of each user message.
    pub user_tokens: (u64, u64),
    /// Tokens of each answer.
    pub output_tokens: (u64, u64),
    /// Mean time between conversation starts, in milliseconds.
    pub mean_interarrival_ms: f64,
    /// Time between the arrivals of two turns of a conversation, in milliseconds.
    pub turn_gap_ms: (u64, u64),
}

impl Default for ChatConfig {
    /// 1,000 conversations starting twice a second, 1 to 10 turns each, over
    /// 8 system prompts of 512 to 4,096 tokens; user messages of 16 to 1,024
    /// tokens, answers of 16 to 512, turns 5 to 60 seconds apart.
    fn default() -> Self {
        Self {
            conversations: 1000,
            system_prompts: 8,
            system_prompt_blocks: (1, 8),
            context_tokens: (0, 0),
            turns: (1, 10),
            user_tokens: (16, 1024),
            output_tokens: (16, 512),
            mean_interarrival_ms: 500.0,
            turn_gap_ms: (5_000, 60_000),
        }
    }
}

impl ChatConfig {
    /// Multi-turn chat whose users think longer than the cache remembers:
    /// 3,000 conversations starting every second on average, 3 to 12 turns
    /// each, 1 to 10 minutes apart (a user reading an answer, then typing),
    /// messages of 64 to 2,048 tokens, answers of 16 to 256, over 8 system
    /// prompts of 512 to 2,048 tokens. Every turn resends the whole
    /// conversation, so each block of it is used once per turn; some 7
    /// requests a second bring about 130 new blocks of 64, so a cache of
    /// 16,384 blocks turns over in about two minutes.
    pub fn long_think() -> Self {
        Self {
            conversations: 3000,
            system_prompts: 8,
            system_prompt_blocks: (1, 4),
            context_tokens: (0, 0),
            turns: (3, 12),
            user_tokens: (64, 2048),
            output_tokens: (16, 256),
            mean_interarrival_ms: 1000.0,
            turn_gap_ms: (60_000, 600_000),
        }
    }

    /// Long multi-turn conversations that return as the cache turns over:
    /// 1,500 conversations starting every second on average, 6 to 12 turns
    /// each, 1 to 6 minutes apart, over 8 system prompts of 512 to 2,048
    /// tokens; messages of 128 to 2,048 tokens, answers of 64 to 512. Every
    /// turn resends the whole conversation (some 13,500 requests, prompts
    /// of 8K tokens on average), so the live conversations hold several
    /// times what a cache of 16,384 blocks of 64 holds, and a
    /// conversation's next turn comes back after one or a few turnovers.
    pub fn multiturn() -> Self {
        Self {
            conversations: 1500,
            system_prompts: 8,
            system_prompt_blocks: (1, 4),
            context_tokens: (0, 0),
            turns: (6, 12),
            user_tokens: (128, 2048),
            output_tokens: (64, 512),
            mean_interarrival_ms: 1000.0,
            turn_gap_ms: (60_000, 360_000),
        }
    }

    /// Shared system prompts under a flood of one-off prompts: 2,000
    /// single-turn requests a second apart on average, each one of 64 system
    /// prompts of 2,048 to 8,192 tokens (5,000 blocks of 64 in all) followed
    /// by a unique document of 4,096 to 32,768 tokens and an answer of 16 to
    /// 256. The one-off documents (about 80 % of the prompt tokens) are never
    /// seen again; a system prompt returns about once a minute, after some
    /// 1.5 million tokens of other prompts, more than a cache of 16,384
    /// blocks holds.
    pub fn prompt_flood() -> Self {
        Self {
            conversations: 2000,
            system_prompts: 64,
            system_prompt_blocks: (4, 16),
            context_tokens: (0, 0),
            turns: (1, 1),
            user_tokens: (4096, 32768),
            output_tokens: (16, 256),
            mean_interarrival_ms: 1000.0,
            turn_gap_ms: (0, 0),
        }
    }

    /// Agent sessions returning to a long context: 300 sessions starting
    /// every 20 seconds on average, each over one of 4 tool-definition
    /// system prompts of 4,096 to 8,192 tokens and a private context (a
    /// repository, a document set) of 8,192 to 32,768 tokens. A session runs
    /// 5 to 60 steps, 10 to 120 seconds apart (the tools run in between:
    /// tests, builds, searches); each step resends the whole session plus a
    /// tool result of 256 to 4,096 tokens and gets back a call of 32 to 128.
    /// Some 100 sessions are live at once, about 7.5 million tokens (a prompt
    /// averages 74K): twice what a cache of 65,536 blocks of 64 holds, while
    /// the requests running at any moment take a fifth of one of 16,384. So
    /// every session comes back after the cache has turned over.
    pub fn agents() -> Self {
        Self {
            conversations: 300,
            system_prompts: 4,
            system_prompt_blocks: (8, 16),
            context_tokens: (8192, 32768),
            turns: (5, 60),
            user_tokens: (256, 4096),
            output_tokens: (32, 128),
            mean_interarrival_ms: 20_000.0,
            turn_gap_ms: (10_000, 120_000),
        }
    }
}

/// A growing conversation: its length in tokens and its hash ids.
struct History {
    len: usize,
    hash_ids: Vec<u64>,
}

impl History {
    /// Appends `n` tokens, filling the last block before opening new ones.
    fn extend(&mut self, n: usize, next_id: &mut u64) {
        self.len += n;
        while self.hash_ids.len() < self.len.div_ceil(HASH_BLOCK_TOKENS) {
            self.hash_ids.push(*next_id);
            *next_id += 1;
        }
    }
}

impl ChatConfig {
    /// Generates the workload for `seed`, in arrival order.
    pub fn generate(&self, seed: u64) -> Trace {
        generate_mix(std::slice::from_ref(self), seed)
    }

    /// Appends this population's requests, numbering new blocks from `next_id`.
    fn generate_into(
        &self,
        rng: &mut SplitMix64,
        next_id: &mut u64,
        requests: &mut Vec<TraceRequest>,
    ) {
        let systems: Vec<Vec<u64>> = (0..self.system_prompts.max(1))
            .map(|_| {
                let (lo, hi) = self.system_prompt_blocks;
                let n = rng.range(lo, hi);
                let ids = (*next_id..*next_id + n).collect();
                *next_id += n;
                ids
            })
            .collect();
        let mut start_ms = 0.0f64;
        for _ in 0..self.conversations {
            start_ms += rng.exponential(self.mean_interarrival_ms);
            let system = &systems[rng.range(0, systems.len() as u64 - 1) as usize];
            let mut history = History {
                len: system.len() * HASH_BLOCK_TOKENS,
                hash_ids: system.clone(),
            };
            if self.context_tokens != (0, 0) {
                let context = rng.range(self.context_tokens.0, self.context_tokens.1);
                history.extend(context as usize, next_id);
            }
            let mut arrival = start_ms.round() as u64;
            for turn in 0..rng.range(self.turns.0, self.turns.1) {
                if turn > 0 {
                    arrival += rng.range(self.turn_gap_ms.0, self.turn_gap_ms.1);
                }
                let user = rng.range(self.user_tokens.0, self.user_tokens.1) as usize;
                history.extend(user, next_id);
                let output = rng.range(self.output_tokens.0, self.output_tokens.1) as usize;
                requests.push(TraceRequest {
                    timestamp: arrival,
                    input_length: history.len,
                    output_length: output,
                    hash_ids: history.hash_ids.clone(),
                });
                history.extend(output, next_id);
            }
        }
    }
}

/// The populations of the built-in generated workload `name` (the names
/// `mla-cache simulate --workload` takes: `chat`, `chat-long-think`,
/// `prompt-flood`, `agents`, `multiturn`, `chat-under-flood`), for
/// [`generate_mix`]; `None` for any other name.
pub fn generated_workload(name: &str) -> Option<Vec<ChatConfig>> {
    Some(match name {
        "chat" => vec![ChatConfig::default()],
        "chat-long-think" => vec![ChatConfig::long_think()],
        "prompt-flood" => vec![ChatConfig::prompt_flood()],
        "agents" => vec![ChatConfig::agents()],
        "multiturn" => vec![ChatConfig::multiturn()],
        "chat-under-flood" => vec![ChatConfig::long_think(), ChatConfig::prompt_flood()],
        _ => return None,
    })
}

/// Generates several populations served by one deployment at once (agents
/// under a flood of one-off prompts, say), merged in arrival order. Each
/// population draws from its own stream of `seed` and has blocks of its own.
pub fn generate_mix(populations: &[ChatConfig], seed: u64) -> Trace {
    let mut next_id = 0u64;
    let mut requests = Vec::new();
    for (i, population) in populations.iter().enumerate() {
        // The first population keeps the seed's own stream.
        let stream = seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        population.generate_into(&mut SplitMix64::new(stream), &mut next_id, &mut requests);
    }
    requests.sort_by_key(|r| r.timestamp);
    Trace {
        requests,
        skipped: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_built_in_workloads_are_named_presets() {
        let presets = [
            ("chat", vec![ChatConfig::default()]),
            ("chat-long-think", vec![ChatConfig::long_think()]),
            ("prompt-flood", vec![ChatConfig::prompt_flood()]),
            ("agents", vec![ChatConfig::agents()]),
            ("multiturn", vec![ChatConfig::multiturn()]),
            (
                "chat-under-flood",
                vec![ChatConfig::long_think(), ChatConfig::prompt_flood()],
            ),
        ];
        for (name, populations) in &presets {
            assert_eq!(
                generated_workload(name).as_ref(),
                Some(populations),
                "{name}"
            );
        }
        // No two presets are alike, so a name mapped to another's shows.
        for (i, (a, x)) in presets.iter().enumerate() {
            for (b, y) in &presets[i + 1..] {
                assert_ne!(x, y, "{a} and {b}");
            }
        }
        assert_eq!(generated_workload("mooncake"), None);
        assert_eq!(generated_workload(""), None);
    }

    fn small() -> ChatConfig {
        ChatConfig {
            conversations: 50,
            ..ChatConfig::default()
        }
    }

    #[test]
    fn the_seed_names_one_workload() {
        assert_eq!(small().generate(1), small().generate(1));
        assert_ne!(small().generate(1), small().generate(2));
    }

    #[test]
    fn every_request_is_a_valid_trace_line_in_arrival_order() {
        let t = small().generate(3);
        assert!(t.requests.len() >= 50);
        assert!(t
            .requests
            .windows(2)
            .all(|w| w[0].timestamp <= w[1].timestamp));
        for r in &t.requests {
            r.validate().unwrap();
        }
    }

    #[test]
    fn follow_ups_extend_their_previous_turn_token_for_token() {
        let cfg = ChatConfig {
            conversations: 1,
            turns: (4, 4),
            ..ChatConfig::default()
        };
        let t = cfg.generate(9);
        assert_eq!(t.requests.len(), 4);
        for w in t.requests.windows(2) {
            let (prev, next) = (&w[0], &w[1]);
            assert!(next.input_length > prev.input_length + prev.output_length);
            // The next prompt starts with the previous prompt and the part of
            // its answer that falls inside the previous prompt's last block.
            let shared = prev.hash_ids.len() * HASH_BLOCK_TOKENS;
            let shared = shared.min(prev.input_length + prev.output_length);
            for p in 0..shared {
                assert_eq!(prev.token_at(p), next.token_at(p), "position {p}");
            }
        }
    }

    #[test]
    fn conversations_share_their_system_prompt_blocks() {
        let cfg = ChatConfig {
            conversations: 20,
            system_prompts: 1,
            ..ChatConfig::default()
        };
        let t = cfg.generate(5);
        let first = t.requests[0].hash_ids[0];
        assert!(t.requests.iter().all(|r| r.hash_ids[0] == first));
    }

    #[test]
    fn a_private_context_opens_only_the_first_turn() {
        let cfg = ChatConfig {
            conversations: 1,
            system_prompts: 1,
            system_prompt_blocks: (2, 2),
            context_tokens: (5000, 5000),
            turns: (3, 3),
            user_tokens: (100, 100),
            output_tokens: (10, 10),
            ..ChatConfig::default()
        };
        let lengths: Vec<usize> = cfg
            .generate(4)
            .requests
            .iter()
            .map(|r| r.input_length)
            .collect();
        assert_eq!(
            lengths,
            [1024 + 5000 + 100, 6124 + 10 + 100, 6234 + 10 + 100]
        );
    }

    #[test]
    fn a_mix_is_its_populations_with_blocks_of_their_own() {
        let chat = small();
        let flood = ChatConfig {
            conversations: 30,
            ..ChatConfig::prompt_flood()
        };
        let seed = 11;
        let alone = [
            chat.generate(seed),
            generate_mix(std::slice::from_ref(&flood), seed ^ 0x9E37_79B9_7F4A_7C15),
        ];
        let populations = [chat, flood];
        let mix = generate_mix(&populations, seed);
        assert_eq!(
            mix,
            generate_mix(&populations, seed),
            "the seed names the mix"
        );
        assert!(mix
            .requests
            .windows(2)
            .all(|w| w[0].timestamp <= w[1].timestamp));
        // The chat's blocks come first; the flood's are numbered after them.
        let chat_ids = 1 + alone[0]
            .requests
            .iter()
            .flat_map(|r| r.hash_ids.iter())
            .max()
            .unwrap();
        let shape = |r: &TraceRequest| (r.timestamp, r.input_length, r.output_length);
        for (population, own) in alone.iter().enumerate() {
            let mut expected: Vec<_> = own.requests.iter().map(shape).collect();
            let mut got: Vec<_> = mix
                .requests
                .iter()
                .filter(|r| (r.hash_ids[0] >= chat_ids) == (population == 1))
                .inspect(|r| {
                    let ours = |&id: &u64| (id >= chat_ids) == (population == 1);
                    assert!(r.hash_ids.iter().all(ours), "a request mixes populations");
                })
                .map(shape)
                .collect();
            expected.sort_unstable();
            got.sort_unstable();
            assert_eq!(got, expected, "population {population}");
        }
    }
}
