"""The MoRSE paper's prompt-level baselines on the same backbone, verifier and records as
`single`: ChatDev's ChatChain, MacNet and AFlow's HumanEval workflow (`run`)."""
