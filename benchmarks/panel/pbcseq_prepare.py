"""Discretise the Mayo Clinic PBC follow-up visits (`pbcseq`) into a panel CSV in jaxctbn's
long format, shipped as `jaxctbn/data/pbcseq_panel.csv`, and the same visits with three
covariates as `jaxctbn/data/pbcseq_visits.csv` (see `jaxctbn/data/README.md`).

    python benchmarks/panel/pbcseq_prepare.py [--source /work/shared/data/pbcseq/pbcseq.csv]

Data: the `pbcseq` object of the CRAN package survival (3.8-6, LGPL >= 2), collected by the Mayo
Clinic (Fleming & Harrington 1991; Therneau & Grambsch 2000). Keep this attribution wherever the
data are shipped.

Discretisation (five binary nodes; an empty cell where the source value is missing):

- `trt`: treatment arm, 1 = D-penicillamine, 0 = placebo (the source CSV's coding; randomised
  and constant per patient, so it never changes in the data);
- `ascites`, `hepato`, `spiders`: the recorded 0/1 clinical signs, unchanged;
- `edema`: 0 when the source `edema` is 0 (no oedema), 1 when it is 0.5 (oedema without
  diuretics, or resolved by them) or 1 (oedema despite diuretics);
- `time` = `day` / 365.25 (years since enrolment); `trajectory_id` = the patient `id`.

`pbcseq_visits.csv` adds `age` (years at enrolment, constant per patient), `sex` (`f`/`m`) and
`log2_bili` (log2 of serum bilirubin in mg/dl, measured at each visit: a time-varying
covariate).
"""

from __future__ import annotations

import argparse
import os

import numpy as np
import pandas as pd

SOURCE = "/work/shared/data/pbcseq/pbcseq.csv"
TARGET = os.path.join(os.path.dirname(__file__), "..", "..", "jaxctbn", "data", "pbcseq_panel.csv")
VISITS = os.path.join(os.path.dirname(TARGET), "pbcseq_visits.csv")
NODES = ("trt", "ascites", "hepato", "spiders", "edema")


def discretise(df: pd.DataFrame) -> pd.DataFrame:
    """The long-format panel frame of the module docstring (nullable integers: missing = <NA>)."""
    out = pd.DataFrame(
        {
            "trajectory_id": df["id"].astype(int),
            "time": df["day"].astype(float) / 365.25,
        }
    )
    for name in ("trt", "ascites", "hepato", "spiders"):
        values = df[name]
        if not set(values.dropna().unique()) <= {0, 1}:
            raise ValueError(f"{name}: expected 0/1 values, got {sorted(values.dropna().unique())}")
        out[name] = values.astype("Int64")
    edema = df["edema"]
    out["edema"] = pd.array(np.where(edema.isna(), pd.NA, (edema > 0).astype(int)), dtype="Int64")
    if out.groupby("trajectory_id")["trt"].nunique().max() != 1:
        raise ValueError("trt: expected one treatment arm per patient")
    return out.sort_values(["trajectory_id", "time"], kind="stable").reset_index(drop=True)


def with_covariates(df: pd.DataFrame) -> pd.DataFrame:
    """The frame of `discretise` with `age`, `sex` and `log2_bili` (same row order)."""
    out = discretise(df)
    source = df.assign(trajectory_id=df["id"].astype(int), time=df["day"].astype(float) / 365.25)
    source = source.sort_values(["trajectory_id", "time"], kind="stable").reset_index(drop=True)
    if not (source.trajectory_id.equals(out.trajectory_id) and source.time.equals(out.time)):
        raise ValueError("rows out of order")
    if source.groupby("trajectory_id")[["age", "sex"]].nunique().max().max() != 1:
        raise ValueError("age, sex: expected one value per patient")
    out["age"] = source["age"].round(2)
    out["sex"] = source["sex"].astype(str)
    out["log2_bili"] = np.log2(source["bili"].astype(float)).round(4)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default=SOURCE)
    parser.add_argument("--out", default=TARGET)
    parser.add_argument("--visits-out", default=VISITS)
    args = parser.parse_args()
    source = pd.read_csv(args.source)
    frame = discretise(source)
    frame.to_csv(args.out, index=False, float_format="%.6f")
    visits = with_covariates(source)
    visits.to_csv(args.visits_out, index=False, float_format="%.6f")
    print(f"wrote {os.path.normpath(args.visits_out)}: the same visits with age, sex, log2_bili")
    print(
        f"wrote {os.path.normpath(args.out)}: {len(frame)} visits of "
        f"{frame.trajectory_id.nunique()} patients; missing cells per node: "
        + ", ".join(f"{n} {int(frame[n].isna().sum())}" for n in NODES)
    )


if __name__ == "__main__":
    main()
