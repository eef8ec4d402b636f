//! Latent storage formats: CPU reference encoders and decoders (in progress).
