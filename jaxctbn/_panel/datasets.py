"""Real data shipped with jaxctbn as package data (provenance and attribution in
`jaxctbn/data/README.md`, which is shipped next to each file)."""

from __future__ import annotations

import importlib.resources

#: The shipped data sets: name -> file in `jaxctbn/data/`.
DATASETS = {
    # Mayo Clinic primary biliary cirrhosis follow-up visits (R package survival's `pbcseq`),
    # five binary clinical signs per visit: a long-format panel CSV (`trajectory_id`, `time`
    # in years since enrolment, `trt`, `ascites`, `hepato`, `spiders`, `edema`)
    "pbcseq_panel": "pbcseq_panel.csv",
    # the same visits with covariates: `age` (at enrolment), `sex` (f/m), `log2_bili` (log2
    # serum bilirubin at each visit, time-varying)
    "pbcseq_visits": "pbcseq_visits.csv",
}


def dataset_path(name: str = "pbcseq_panel") -> str:
    """The path of a data set shipped with jaxctbn, for [`jaxctbn.panel.PanelObservations.read_csv`][] or the
    CLI's `--data`. `"pbcseq_panel"`: the Mayo Clinic PBC visits (survival package `pbcseq`;
    Fleming & Harrington 1991, Therneau & Grambsch 2000) with five binary signs;
    `"pbcseq_visits"`: the same visits with `age`, `sex` and `log2_bili` as covariates. See
    `jaxctbn/data/README.md` for the discretisation and the attribution to keep."""
    if name not in DATASETS:
        raise ValueError(f"name: unknown data set {name!r}; valid: {', '.join(DATASETS)}.")
    return str(importlib.resources.files("jaxctbn") / "data" / DATASETS[name])
