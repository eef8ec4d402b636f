//! Latent stores on host and GPU memory (in progress).

#[cfg(feature = "cuda")]
pub mod cuda;
