"""The assumption sentences a Certifier states in its certificates, and the noise sources it records."""

from __future__ import annotations

#: Stated in every certificate a Certifier writes: what it does not cover.
CURATOR_ASSUMPTION = (
    "The certificate covers the released checkpoint only. The run directory's ledger.json and curator/ "
    "(anything computed from the private data without noise) are curator-side, not covered, and must not "
    "be published."
)
DISJOINT_ASSUMPTION = (
    "Tasks hold disjoint privacy units: no person/unit contributes data to two tasks (Tobaben et al., Thm 4.4)."
)
SHARED_ASSUMPTION = "Privacy units may occur in several tasks; releases compose sequentially (Tobaben et al., Thm 4.5)."
COUNTS_ASSUMPTION = (
    "Per-task example counts stated in this certificate (task sizes, examples kept and dropped by the public "
    "label sets) are treated as public: epsilon does not cover them."
)

#: Noise sources a Certifier records per task (ledger metadata ``certifier.noise_sources``).
NOISE_OS_ENTROPY = "os_entropy"
NOISE_REPRODUCIBLE = "reproducible_seed"

#: Stated by a Certifier without a privacy filter: composition needs the charges' parameters fixed in advance.
FIXED_PARAMETERS_ASSUMPTION = (
    "No privacy filter: the privacy parameters of every charge (noise scale, sample rate, number of steps, "
    "sensitivity, and which tasks' data it reads) were fixed before any earlier release was seen. Composition then "
    "holds although what each mechanism computes may depend on earlier releases; parameters chosen after seeing "
    "earlier releases are not covered (a privacy filter, total_epsilon, covers them)."
)


def adaptive_filter_assumption(total_epsilon: float, total_delta: float, across_tasks: str) -> str:
    """Stated by a Certifier with a privacy filter: adaptively chosen parameters are covered by its budget."""
    scope = "the whole stream" if across_tasks == "sequential" else "each task's data"
    return (
        f"Privacy filter over {scope} (total_epsilon = {total_epsilon:g}, total_delta = {total_delta:g}): the "
        "parameters of each charge may have been chosen after seeing earlier releases (fully adaptive composition: "
        "Rogers et al. 2016, Whitehouse et al. 2023; Gaussian rule: Smith & Thakurta 2022). The filter refused every "
        f"charge that would overspend, so the guarded data stay ({total_epsilon:g}, {total_delta:g})-DP whatever "
        "the choices; the headline epsilon composes the charged events as if their parameters had been fixed in "
        f"advance, and under adaptive choice ({total_epsilon:g}, {total_delta:g}) is the bound."
    )

