"""The task lifecycle: one state machine and its policy behind three ports (docs/architecture.md,
"The task lifecycle"). `core.Lifecycle` is the only copy of a task's states; the engines implement
`ports` (network, compute, recorder)."""
