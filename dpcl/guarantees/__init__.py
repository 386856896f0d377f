"""DP continual-learning semantics: task ledger, label-space policy, per-token
budgets, Lifelong-DP bounds, method privacy plans, certificates. Never imports torch."""
