"""Published microbenchmarks (measurements/published/) against gpusim's kernel predictions:
per device and kind of kernel, the mean absolute and signed error of predicted time, and
whether the device's calibration was fitted on those figures (in-sample) or not (held out).

    python benchmarks/published_micro.py
"""

from __future__ import annotations

from gpusim.validate.published_micro import published_files, report


def main() -> None:
    print(f"{'device':<16}{'kernels':<34}{'cases':>6}{'|error|':>9}{'signed':>9}  "
          f"{'fit':<10}worst case")
    for path in published_files():
        for g in report(path):
            fit = "in-sample" if g.in_sample else "held out"
            print(f"{g.device:<16}{g.group:<34}{g.cases:>6}{g.mean_abs_error:>9.1%}"
                  f"{g.mean_signed_error:>+9.1%}  {fit:<10}{g.worst_case} "
                  f"({g.worst_error:+.0%})")
    print("\nerror: predicted time over the published figure's, minus 1 (negative: gpusim "
          "predicts the kernel faster than measured)")


if __name__ == "__main__":
    main()
