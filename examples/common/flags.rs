//! The flags of the examples that measure the conversational workloads:
//! `--workload a,b`, `--blocks n,m`, `--seed s`, and integer flags of an
//! example's own.

/// What the flags chose.
pub struct Flags {
    /// Generated workloads, by `simulate --workload` name.
    pub workloads: Vec<String>,
    /// Cache sizes, in blocks.
    pub sizes: Vec<usize>,
    /// The workload generator's seed.
    pub seed: u64,
}

impl Flags {
    /// The conversational workloads at 8,192, 16,384 and 65,536 blocks,
    /// seed 0.
    pub fn conversational() -> Self {
        Self {
            workloads: ["multiturn", "chat-long-think", "agents"]
                .map(String::from)
                .to_vec(),
            sizes: vec![8192, 16_384, 65_536],
            seed: 0,
        }
    }

    /// Reads the process's arguments over these defaults; `own` pairs the
    /// example's own flags with the values they set.
    pub fn parse(mut self, own: &mut [(&str, &mut usize)]) -> Result<Self, String> {
        let mut args = std::env::args().skip(1);
        while let Some(flag) = args.next() {
            let value = args.next().ok_or(format!("{flag} needs a value"))?;
            let bad = |e: std::num::ParseIntError| format!("{flag} {value}: {e}");
            match flag.as_str() {
                "--workload" => {
                    self.workloads = value.split(',').map(|s| s.trim().to_string()).collect()
                }
                "--blocks" => {
                    self.sizes = value
                        .split(',')
                        .map(|s| s.trim().parse().map_err(bad))
                        .collect::<Result<_, _>>()?
                }
                "--seed" => self.seed = value.parse().map_err(bad)?,
                other => {
                    let (_, slot) = own
                        .iter_mut()
                        .find(|(name, _)| *name == other)
                        .ok_or(format!("unknown flag {other}"))?;
                    **slot = value.parse().map_err(bad)?;
                }
            }
        }
        Ok(self)
    }
}
