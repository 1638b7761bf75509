"""The Warden plane: the gRPC server that governs what AI models may call."""
