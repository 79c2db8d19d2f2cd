// A continuous-time Markov chain seen at panel visits (msm's model, written for jaxctbn's
// benchmarks): free intensities q_p at (qrow[p], qcol[p]) of a K x K generator, Gamma(alpha,
// beta) priors on each, the likelihood conditional on each subject's first observation: per
// interval exp(Q dt)[from, to], or, for an exact entry into `to` (msm's deathexact),
// sum_{k != to} exp(Q dt)[from, k] Q[k, to].
data {
  int<lower=1> K;
  int<lower=1> P;
  array[P] int<lower=1, upper=K> qrow;
  array[P] int<lower=1, upper=K> qcol;
  int<lower=1> N;
  vector<lower=0>[N] dt;
  array[N] int<lower=1, upper=K> from;
  array[N] int<lower=1, upper=K> to;
  array[N] int<lower=0, upper=1> exact;
  real<lower=0> alpha;
  real<lower=0> beta;
}
parameters {
  vector<lower=0>[P] q;
}
model {
  matrix[K, K] Q = rep_matrix(0, K, K);
  for (p in 1:P) Q[qrow[p], qcol[p]] = q[p];
  for (k in 1:K) Q[k, k] = -sum(Q[k]);
  q ~ gamma(alpha, beta);
  for (n in 1:N) {
    matrix[K, K] E = matrix_exp(Q * dt[n]);
    if (exact[n]) {
      real s = 0;
      for (k in 1:K) if (k != to[n]) s += E[from[n], k] * Q[k, to[n]];
      target += log(s);
    } else {
      target += log(E[from[n], to[n]]);
    }
  }
}
