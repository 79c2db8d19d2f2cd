# Fit one msm model with the Hessian, and write its intervals as JSON.
#
# Usage: Rscript run_msm_intervals.R SPEC.json OUT.json
#
# SPEC fields: data, subject, time, state (columns; states 1..k), qmatrix (k x k initial
# intensities, zeros structural), deathexact (states or null), covariates (a formula as text,
# e.g. "~ sex", or null), pci (cut times or null), control (optim's), repeats (timed fits; the
# shortest counts).
#
# OUT fields: minus2loglik, Q (baseline intensities: at the covariates' means, msm's
# center = TRUE), se, lower, upper (qmatrix.msm(ci = "delta"), row-major matrices), hazard
# ratios per covariate (hazard.msm: HR, L, U matrices of the allowed transitions, msm's order),
# converged, time_fit_s, n_parameters.
suppressPackageStartupMessages({
  library(msm)
  library(jsonlite)
})
args <- commandArgs(trailingOnly = TRUE)
spec <- fromJSON(args[1], simplifyVector = TRUE)
raw <- read.csv(spec$data)
d <- raw
d$subject <- raw[[spec$subject]]
d$time <- raw[[spec$time]]
d$state <- raw[[spec$state]]
Q <- as.matrix(spec$qmatrix)
storage.mode(Q) <- "double"
diag(Q) <- 0
diag(Q) <- -rowSums(Q)
opt <- function(name, default) if (is.null(spec[[name]])) default else spec[[name]]
covariates <- opt("covariates", NULL)
form <- if (is.null(covariates)) NULL else as.formula(covariates)
repeats <- opt("repeats", 1)
times <- numeric(0)
for (i in seq_len(repeats)) {
  times <- c(times, system.time({
    fit <- msm(state ~ time, subject = subject, data = d, qmatrix = Q,
               deathexact = opt("deathexact", NULL), covariates = form, pci = opt("pci", NULL),
               hessian = TRUE, control = opt("control", list()))
  })[["elapsed"]])
}
q <- qmatrix.msm(fit, ci = "delta")
rows <- function(m) unname(lapply(seq_len(nrow(m)), function(i) unname(m[i, ])))
hr <- list()
if (!is.null(form) || !is.null(opt("pci", NULL))) {
  h <- hazard.msm(fit)
  for (name in names(h)) {
    hr[[name]] <- list(transitions = rownames(h[[name]]), HR = unname(h[[name]][, "HR"]),
                       L = unname(h[[name]][, "L"]), U = unname(h[[name]][, "U"]))
  }
}
res <- list(
  minus2loglik = fit$minus2loglik,
  Q = rows(unclass(q$estimates)), se = rows(unclass(q$SE)),
  lower = rows(unclass(q$L)), upper = rows(unclass(q$U)),
  hazard_ratios = hr,
  converged = isTRUE(fit$opt$convergence == 0),
  time_fit_s = min(times),
  n_parameters = length(fit$estimates),
  msm_version = as.character(packageVersion("msm"))
)
writeLines(toJSON(res, auto_unbox = TRUE, digits = NA, null = "null", na = "null"), args[2])
