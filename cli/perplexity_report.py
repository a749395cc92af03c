"""The lines llama-perplexity prints, in its formats: per-chunk perplexity, the final estimate,
and the --kl-divergence table and summary."""

from __future__ import annotations

import math

from vkrt.engine.kl_divergence import KLStats, median, percentile, safe_div
from vkrt.engine.perplexity import NllSums

KL_HEADER = ("chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence              Δp RMS"
             "            Same top p")
KL_PERCENTILES = (0.999, 0.990, 0.950, 0.900)
KL_LOW_PERCENTILES = (0.100, 0.050, 0.010, 0.001)
P_DIFF_PERCENTILES = (0.999, 0.990, 0.950, 0.900, 0.750)
P_DIFF_LOW_PERCENTILES = (0.250, 0.100, 0.050, 0.010, 0.001)


def eta(stage: str, seconds: float, n_chunk: int) -> str:
    """'perplexity: 1.23 seconds per pass - ETA [H hours ]M.MM minutes'."""
    total = int(seconds * n_chunk)
    hours = ""
    if total >= 3600:
        hours, total = f"{total // 3600} hours ", total % 3600
    return f"{stage}: {seconds:.2f} seconds per pass - ETA {hours}{total / 60.0:.2f} minutes"


def chunk_ppl(i: int, sums: NllSums) -> str:
    return f"[{i + 1}]{sums.ppl:.4f},"


def final_estimate(sums: NllSums) -> str:
    err = sums.ppl_error
    if err is None:
        return "Unexpected negative standard deviation of log(prob)"
    return f"Final estimate: PPL = {sums.ppl:.4f} +/- {err:.5f}"


def kl_chunk(i: int, kl: KLStats) -> str:
    """The table row after chunk i: running PPL, ln ratio, KL divergence, RMS Δp, same top."""
    log_ppl, dlog_ppl = kl.log_ppl()
    ppl = math.exp(log_ppl)
    ratio, dratio = kl.log_ppl_ratio()
    kld, dkld = kl.kld()
    rms, drms = kl.p_diff_rms()
    top, dtop = kl.same_top()
    return (f"{i + 1:4d}    {ppl:9.4f} ± {ppl * dlog_ppl:9.4f}    {ratio:10.5f} ± {dratio:10.5f}"
            f"    {kld:10.5f} ± {dkld:10.5f}    {100 * rms:6.3f} ± {100 * drms:6.3f} %"
            f"    {100 * top:6.3f} ± {100 * dtop:6.3f} %")


def kl_summary(kl: KLStats) -> list[str]:
    """The closing statistics (llama-perplexity prints them from 100 scored tokens on)."""
    log_ppl, dlog_ppl = kl.log_ppl()
    log_base, dlog_base = kl.log_ppl_base()
    ppl, ppl_base = math.exp(log_ppl), math.exp(log_base)
    dppl, dppl_base = ppl * dlog_ppl, ppl_base * dlog_base
    cov = kl.log_ppl_cov()
    ratio, dratio = kl.log_ppl_ratio()
    ppl_cov = ppl * ppl_base * cov
    diff_var = dppl * dppl + dppl_base * dppl_base - 2.0 * ppl_cov
    kld, dkld = kl.kld()
    klds, p_diffs = kl.sorted_kld(), kl.sorted_p_diff()
    p_diff, dp_diff = kl.p_diff_mean()
    rms, drms = kl.p_diff_rms()
    top, dtop = kl.same_top()
    lines = ["====== Perplexity statistics ======",
             f"Mean PPL(Q)                   : {ppl:10.6f} ± {dppl:10.6f}",
             f"Mean PPL(base)                : {ppl_base:10.6f} ± {dppl_base:10.6f}",
             f"Cor(ln(PPL(Q)), ln(PPL(base))): {100.0 * safe_div(cov, dlog_ppl * dlog_base):6.2f}%",
             f"Mean ln(PPL(Q)/PPL(base))     : {ratio:10.6f} ± {dratio:10.6f}",
             f"Mean PPL(Q)/PPL(base)         : {math.exp(ratio):10.6f} ± {math.exp(ratio) * dratio:10.6f}",
             f"Mean PPL(Q)-PPL(base)         : {ppl - ppl_base:10.6f} ± "
             f"{math.sqrt(diff_var) if diff_var >= 0 else math.nan:10.6f}",
             "",
             "====== KL divergence statistics ======",
             f"Mean    KLD: {kld:10.6f} ± {dkld:10.6f}",
             f"Maximum KLD: {float(klds[-1]):10.6f}"]
    lines += [f"{_pct(f)}   KLD: {percentile(klds, f):10.6f}" for f in KL_PERCENTILES]
    lines.append(f"Median  KLD: {median(klds):10.6f}")
    lines += [f"{_pct(f)}   KLD: {percentile(klds, f):10.6f}" for f in KL_LOW_PERCENTILES]
    lines += [f"Minimum KLD: {float(klds[0]):10.6f}",
              "",
              "====== Token probability statistics ======",
              f"Mean    Δp: {100.0 * p_diff:6.3f} ± {100.0 * dp_diff:5.3f} %",
              f"Maximum Δp: {100.0 * float(p_diffs[-1]):6.3f}%"]
    lines += [f"{_pct(f)}   Δp: {100.0 * percentile(p_diffs, f):6.3f}%" for f in P_DIFF_PERCENTILES]
    lines.append(f"Median  Δp: {100.0 * median(p_diffs):6.3f}%")
    lines += [f"{_pct(f)}   Δp: {100.0 * percentile(p_diffs, f):6.3f}%" for f in P_DIFF_LOW_PERCENTILES]
    lines += [f"Minimum Δp: {100.0 * float(p_diffs[0]):6.3f}%",
              f"RMS Δp    : {100.0 * rms:6.3f} ± {100.0 * drms:5.3f} %",
              f"Same top p: {100.0 * top:6.3f} ± {100.0 * dtop:5.3f} %"]
    return lines


def _pct(fraction: float) -> str:
    """'99.9%', ' 5.0%': llama-perplexity's labels."""
    return f"{100 * fraction:4.1f}%"
