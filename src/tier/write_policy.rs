//! When a device-tier block is copied to the lower tiers (SGLang HiCache's
//! write policies).

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// When blocks are copied from the device tier (L1) down to the host (L2)
/// and remote (L3) tiers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WritePolicy {
    /// Every block, as soon as it is computed and indexed. The remote tier
    /// sees every block early, so other nodes share it soonest.
    #[default]
    WriteThrough,
    /// Only blocks hit (reused from L1 by an admission) at least
    /// `min_hits` times: hot prefixes go down, one-off blocks never do.
    WriteThroughSelective {
        /// Hits before the copy (at least 1).
        min_hits: u32,
    },
    /// When the device tier evicts a block, before its new owner writes it:
    /// the least copying, at the price of sharing late.
    WriteBack,
}

impl fmt::Display for WritePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::WriteThrough => f.write_str("write-through"),
            Self::WriteThroughSelective { min_hits } => {
                write!(f, "write-through-selective:{min_hits}")
            }
            Self::WriteBack => f.write_str("write-back"),
        }
    }
}

impl FromStr for WritePolicy {
    type Err = Error;

    /// `write-through`, `write-through-selective[:N]` (N defaults to 2) or `write-back`.
    fn from_str(s: &str) -> Result<Self> {
        let bad = || {
            Error::InvalidArgument(format!(
                "unknown write policy {s:?} (write-through, write-through-selective[:N], write-back)"
            ))
        };
        match s.split_once(':') {
            None if s == "write-through" => Ok(Self::WriteThrough),
            None if s == "write-back" => Ok(Self::WriteBack),
            None if s == "write-through-selective" => {
                Ok(Self::WriteThroughSelective { min_hits: 2 })
            }
            Some(("write-through-selective", n)) => match n.parse() {
                Ok(min_hits) if min_hits >= 1 => Ok(Self::WriteThroughSelective { min_hits }),
                _ => Err(bad()),
            },
            _ => Err(bad()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for p in [
            WritePolicy::WriteThrough,
            WritePolicy::WriteThroughSelective { min_hits: 3 },
            WritePolicy::WriteBack,
        ] {
            assert_eq!(p.to_string().parse::<WritePolicy>().unwrap(), p);
        }
        assert_eq!(
            "write-through-selective".parse::<WritePolicy>().unwrap(),
            WritePolicy::WriteThroughSelective { min_hits: 2 }
        );
        for bad in ["write-around", "write-through-selective:0", "write-back:2"] {
            assert!(bad.parse::<WritePolicy>().is_err(), "{bad}");
        }
    }
}
