# Fit (or evaluate) one msm model on a CSV of long-format panel data and write the result as JSON.
#
# Usage: Rscript run_msm.R SPEC.json OUT.json
#
# SPEC fields:
#   data         path of the CSV (one row per observation)
#   subject, time, state   column names (states are 1..k)
#   qmatrix      k x k list of rows: initial intensities; zeros off the diagonal are structural
#                (msm's convention; the diagonal is ignored)
#   deathexact   optional vector of states whose entry time is exact (obstype 3), or null
#   qconstraint  optional vector of integer labels tying the allowed intensities (msm's order:
#                row by row along the rows of qmatrix), or null
#   fixedpars    optional, true = no optimisation: evaluate -2 log-likelihood at qmatrix
#   hessian      optional (default false): numerical Hessian after optimisation
#   control      optional list passed to optim (fnscale, reltol, maxit, ...)
#   opt_method   optional (default "optim"; optim's method is BFGS in msm)
#   repeats      optional (default 1): run the msm() call this many times (same result)
#
# OUT fields: minus2loglik, Q (fitted baseline intensity matrix, row-major), converged
# (optim's convergence == 0), counts (function / gradient evaluations), message,
# time_fit_s (elapsed seconds of the msm() call, measured inside R; the shortest of `repeats`
# calls), time_fit_all_s (every call's), msm_version, n_subjects,
# n_observations (rows msm used).
suppressPackageStartupMessages({
  library(msm)
  library(jsonlite)
})
args <- commandArgs(trailingOnly = TRUE)
if (length(args) != 2) stop("usage: Rscript run_msm.R SPEC.json OUT.json")
spec <- fromJSON(args[1], simplifyVector = TRUE)

d <- read.csv(spec$data)
d <- data.frame(subject = d[[spec$subject]], time = d[[spec$time]], state = d[[spec$state]])
Q <- as.matrix(spec$qmatrix)
storage.mode(Q) <- "double"
diag(Q) <- 0
diag(Q) <- -rowSums(Q)

opt <- function(name, default) if (is.null(spec[[name]])) default else spec[[name]]
deathexact <- opt("deathexact", NULL)
qconstraint <- opt("qconstraint", NULL)
fixedpars <- isTRUE(opt("fixedpars", FALSE))
hessian <- isTRUE(opt("hessian", FALSE))
control <- opt("control", list())
opt.method <- opt("opt_method", "optim")

repeats <- opt("repeats", 1)
fit <- NULL
times <- numeric(0)
for (i in seq_len(repeats)) {
  times <- c(times, system.time({
    fit <- msm(state ~ time, subject = subject, data = d, qmatrix = Q,
               deathexact = deathexact, qconstraint = qconstraint,
               fixedpars = if (fixedpars) TRUE else NULL,
               hessian = if (fixedpars) FALSE else hessian,
               control = control, opt.method = opt.method)
  })[["elapsed"]])
}
elapsed <- min(times)

Qfit <- fit$Qmatrices$baseline
o <- fit$opt
res <- list(
  minus2loglik = fit$minus2loglik,
  Q = unname(lapply(seq_len(nrow(Qfit)), function(i) unname(Qfit[i, ]))),
  converged = if (fixedpars) NA else isTRUE(o$convergence == 0),
  convergence_code = if (fixedpars || is.null(o$convergence)) NA else o$convergence,
  counts = if (fixedpars || is.null(o$counts)) NA else as.list(o$counts),
  message = if (fixedpars || is.null(o$message)) NA else o$message,
  time_fit_s = elapsed,
  time_fit_all_s = times,
  msm_version = as.character(packageVersion("msm")),
  n_subjects = length(unique(fit$data$mf$"(subject)")),
  n_observations = nrow(fit$data$mf)
)
writeLines(toJSON(res, auto_unbox = TRUE, digits = NA, null = "null", na = "null"), args[2])
