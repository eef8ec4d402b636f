//! Workload replay through the block manager.
