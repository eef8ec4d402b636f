//! Workload replay through the block manager (in progress).
