//! Mooncake-format request traces (JSON Lines) and the token ids they stand for.
//!
//! One request per line:
//!
//! ```text
//! {"timestamp": 40, "input_length": 1100, "output_length": 3, "hash_ids": [7, 8, 9]}
//! ```
//!
//! `timestamp` is the arrival time in milliseconds; each hash id names one
//! 512-token block of the prompt, the last one possibly partial, so a request
//! has exactly `ceil(input_length / 512)` hash ids. Equal ids mean equal
//! content, which is how the trace encodes shared prefixes without shipping
//! any text. Unknown fields are ignored; blank lines are skipped.
//!
//! # Tokens
//!
//! The simulation needs token ids. Position `p` of a request (prompt first,
//! then its output) is token
//!
//! ```text
//! p < 512 x len(hash_ids):  hash_ids[p / 512] x 512 + p % 512
//! otherwise:                GENERATED_TOKEN_BASE + p % 512
//! ```
//!
//! So two prompts share exactly the tokens of their common leading hash ids,
//! output tokens that fall inside the prompt's last (partial) hash block
//! continue it, and later output tokens use a range no prompt can contain.
//! Hash ids must stay below [`MAX_HASH_ID`] for all of this to fit in a
//! 32-bit token id.

use std::fmt;

use serde::{Deserialize, Serialize};

use mla_cache::TokenId;

/// Tokens named by one hash id.
pub const HASH_BLOCK_TOKENS: usize = 512;

/// First token id of the range used for output tokens past the prompt's
/// hash blocks (`u32::MAX + 1 - 512`).
pub const GENERATED_TOKEN_BASE: TokenId = TokenId::MAX - (HASH_BLOCK_TOKENS as TokenId - 1);

/// Largest hash id accepted: its tokens stay below [`GENERATED_TOKEN_BASE`].
pub const MAX_HASH_ID: u64 = GENERATED_TOKEN_BASE as u64 / HASH_BLOCK_TOKENS as u64 - 1;

/// One request of a trace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceRequest {
    /// Arrival time in milliseconds from the start of the trace.
    pub timestamp: u64,
    /// Prompt tokens.
    pub input_length: usize,
    /// Tokens the request generates.
    pub output_length: usize,
    /// One id per 512-token prompt block; the last may be partial.
    pub hash_ids: Vec<u64>,
}

impl TraceRequest {
    /// Checks the request against the format's rules (see the module docs).
    pub fn validate(&self) -> Result<(), String> {
        if self.input_length == 0 {
            return Err("input_length must be positive".into());
        }
        let expected = self.input_length.div_ceil(HASH_BLOCK_TOKENS);
        if self.hash_ids.len() != expected {
            return Err(format!(
                "input_length {} needs {expected} hash ids (one per {HASH_BLOCK_TOKENS} tokens), got {}",
                self.input_length,
                self.hash_ids.len()
            ));
        }
        if let Some(&h) = self.hash_ids.iter().find(|&&h| h > MAX_HASH_ID) {
            return Err(format!(
                "hash id {h} exceeds {MAX_HASH_ID} (its tokens would not fit 32 bits)"
            ));
        }
        Ok(())
    }

    /// Token id at position `pos` (prompt positions first, then output).
    pub fn token_at(&self, pos: usize) -> TokenId {
        let offset = (pos % HASH_BLOCK_TOKENS) as TokenId;
        match self.hash_ids.get(pos / HASH_BLOCK_TOKENS) {
            Some(&h) => h as TokenId * HASH_BLOCK_TOKENS as TokenId + offset,
            None => GENERATED_TOKEN_BASE + offset,
        }
    }

    /// The prompt's `input_length` token ids.
    pub fn prompt_tokens(&self) -> Vec<TokenId> {
        (0..self.input_length).map(|p| self.token_at(p)).collect()
    }

    /// The request as one trace line (no trailing newline).
    pub fn to_json_line(&self) -> String {
        serde_json::to_string(self).expect("a trace request always serializes")
    }
}

/// A line of a trace that could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct TraceLineError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong with it.
    pub message: String,
}

/// What to do with a malformed line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnMalformed {
    /// Report it in [`Trace::skipped`] and go on.
    #[default]
    Skip,
    /// Fail the whole parse with the first malformed line.
    Fail,
}

/// A parsed trace: its requests in arrival order and the lines skipped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Trace {
    /// Requests, sorted by timestamp (ties keep file order).
    pub requests: Vec<TraceRequest>,
    /// Malformed lines that were skipped.
    pub skipped: Vec<TraceLineError>,
}

impl Trace {
    /// Parses JSON Lines text. With [`OnMalformed::Fail`] the first malformed
    /// line is the error; with [`OnMalformed::Skip`] it is recorded and
    /// skipped. Never panics on any input.
    pub fn parse(text: &str, on_malformed: OnMalformed) -> Result<Trace, TraceLineError> {
        let mut trace = Trace::default();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            let parsed = serde_json::from_str::<TraceRequest>(line)
                .map_err(|e| {
                    // Within one line serde's "at line 1 column N" misleads: keep the column.
                    let mut message = e.to_string();
                    if let Some(at) = message.rfind(" at line ") {
                        message.truncate(at);
                    }
                    format!("{message} (column {})", e.column())
                })
                .and_then(|r| r.validate().map(|()| r));
            match parsed {
                Ok(r) => trace.requests.push(r),
                Err(message) => {
                    let err = TraceLineError {
                        line: i + 1,
                        message,
                    };
                    match on_malformed {
                        OnMalformed::Skip => trace.skipped.push(err),
                        OnMalformed::Fail => return Err(err),
                    }
                }
            }
        }
        trace.requests.sort_by_key(|r| r.timestamp);
        Ok(trace)
    }

    /// Writes the requests as JSON Lines (the format [`Trace::parse`] reads).
    pub fn to_jsonl(&self) -> String {
        let mut out = String::new();
        for r in &self.requests {
            out.push_str(&r.to_json_line());
            out.push('\n');
        }
        out
    }
}

impl fmt::Display for Trace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let prompt: usize = self.requests.iter().map(|r| r.input_length).sum();
        let output: usize = self.requests.iter().map(|r| r.output_length).sum();
        write!(
            f,
            "{} requests, {prompt} prompt tokens, {output} output tokens",
            self.requests.len()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_follow_hash_ids_then_the_generated_range() {
        let r = TraceRequest {
            timestamp: 0,
            input_length: 600,
            output_length: 2,
            hash_ids: vec![3, 9],
        };
        assert_eq!(r.token_at(0), 3 * 512);
        assert_eq!(r.token_at(511), 3 * 512 + 511);
        assert_eq!(r.token_at(512), 9 * 512);
        // Output inside the partial last block continues it ...
        assert_eq!(r.token_at(600), 9 * 512 + 88);
        // ... and past it uses the generated range.
        assert_eq!(r.token_at(1024), GENERATED_TOKEN_BASE);
        assert_eq!(r.token_at(1024 + 511), TokenId::MAX);
        assert_eq!(r.prompt_tokens().len(), 600);
    }

    #[test]
    fn the_largest_hash_id_stays_below_the_generated_range() {
        let r = TraceRequest {
            timestamp: 0,
            input_length: 512,
            output_length: 0,
            hash_ids: vec![MAX_HASH_ID],
        };
        assert!(r.validate().is_ok());
        assert!(r.token_at(511) < GENERATED_TOKEN_BASE);
        let r = TraceRequest {
            hash_ids: vec![MAX_HASH_ID + 1],
            ..r
        };
        assert!(r.validate().unwrap_err().contains("exceeds"));
    }

    #[test]
    fn malformed_lines_are_skipped_or_fatal_with_their_line_number() {
        let text = "{\"timestamp\": 5, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1]}\n\
                    \n\
                    not json\n\
                    {\"timestamp\": 1, \"input_length\": 600, \"output_length\": 1, \"hash_ids\": [1]}\n\
                    {\"timestamp\": 2, \"input_length\": 0, \"output_length\": 1, \"hash_ids\": []}\n\
                    {\"timestamp\": 0, \"input_length\": 3, \"output_length\": 0, \"hash_ids\": [2], \"x\": 1}\n";
        let t = Trace::parse(text, OnMalformed::Skip).unwrap();
        assert_eq!(t.requests.len(), 2);
        assert_eq!(t.requests[0].timestamp, 0, "sorted by arrival");
        let lines: Vec<usize> = t.skipped.iter().map(|e| e.line).collect();
        assert_eq!(lines, [3, 4, 5]);
        assert!(t.skipped[1].message.contains("needs 2 hash ids"));
        assert_eq!(t.skipped[0].message, "expected ident (column 2)");
        let err = Trace::parse(text, OnMalformed::Fail).unwrap_err();
        assert_eq!(err.line, 3);
        assert!(err.to_string().starts_with("line 3: "));
    }

    #[test]
    fn the_embedded_trace_is_whole() {
        let t = Trace::parse(crate::MOONCAKE_SYNTHETIC_TRACE, OnMalformed::Fail).unwrap();
        assert_eq!(t.requests.len(), 3993);
        let prompt: usize = t.requests.iter().map(|r| r.input_length).sum();
        assert_eq!(prompt, 61_194_628);
    }

    #[test]
    fn jsonl_round_trips() {
        let text =
            "{\"timestamp\":1,\"input_length\":513,\"output_length\":4,\"hash_ids\":[0,1]}\n";
        let t = Trace::parse(text, OnMalformed::Fail).unwrap();
        assert_eq!(t.to_jsonl(), text);
    }

    #[test]
    fn garbage_never_panics() {
        for text in [
            "{",
            "[]",
            "{\"timestamp\": -1}",
            "\u{0}",
            "{\"timestamp\": 1e99, \"input_length\": 1}",
        ] {
            let t = Trace::parse(text, OnMalformed::Skip).unwrap();
            assert_eq!(t.skipped.len(), 1, "{text:?}");
        }
    }
}
