//! What the examples that measure the conversational workloads read of a
//! workload's conversations.

use mla_cache::sim::ChatConfig;

/// A workload's conversations: their think times and turn counts.
pub struct Conversations {
    /// Think times between two turns, in milliseconds (uniform, inclusive).
    pub think_ms: (u64, u64),
    /// Turns of a conversation (uniform, inclusive).
    pub turns: (u64, u64),
}

impl Conversations {
    /// The conversations of the workload's one population with several
    /// turns (beside it, populations of one turn each may run: one-off
    /// documents).
    pub fn of(populations: &[ChatConfig]) -> Result<Self, String> {
        let mut conversational = populations.iter().filter(|p| p.turns.1 > 1);
        let (Some(p), None) = (conversational.next(), conversational.next()) else {
            return Err("the workload needs exactly one population with several turns".into());
        };
        Ok(Self {
            think_ms: p.turn_gap_ms,
            turns: p.turns,
        })
    }

    /// The most turns of any conversation of the workload: a block used
    /// more often is shared.
    pub fn max_turns(&self) -> u64 {
        self.turns.1
    }
}
