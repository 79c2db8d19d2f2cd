# Export msm's bundled panel data sets to CSV so that Python reads exactly the rows msm fits.
# Usage: Rscript export_data.R OUT_DIR
# Writes OUT_DIR/<name>.csv for cav, psor, bos3, bos4, aneur (all columns, R's row order) and
# OUT_DIR/msm_version.txt.
suppressPackageStartupMessages(library(msm))
args <- commandArgs(trailingOnly = TRUE)
out <- if (length(args) >= 1) args[1] else "."
dir.create(out, showWarnings = FALSE, recursive = TRUE)
for (name in c("cav", "psor", "bos3", "bos4", "aneur")) {
  d <- get(name)
  write.csv(d, file.path(out, paste0(name, ".csv")), row.names = FALSE)
}
writeLines(as.character(packageVersion("msm")), file.path(out, "msm_version.txt"))
