//! Latent stores on host and GPU memory (in progress).
