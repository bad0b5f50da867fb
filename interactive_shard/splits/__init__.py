"""Graph splits: how torch.compile's DDPOptimizer cuts a DDP model, and what each piece holds."""
