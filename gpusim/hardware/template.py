"""A profile of one's own device, started from a shipped one (``gpusim profiles new``)."""

from __future__ import annotations

from pathlib import Path

import yaml

from gpusim.hardware.profile import HardwareProfile


def profile_template(base: HardwareProfile, path: Path) -> str:
    """The YAML of ``base`` to edit into a profile named after ``path``: every field (units
    are in their names), no prices, and each source a TODO that names the original."""
    data = base.model_dump(mode="json", exclude_none=True)
    for key in ("cloud_prices", "street_prices", "launch_price_usd"):
        data.pop(key, None)
    data.update(name=path.stem, full_name=f"{base.full_name} (edit: your device)", aliases=[])
    data["sources"] = {key: f"TODO: where your {key} comes from (copied from {base.name}: "
                            f"{value})" for key, value in base.sources.items()
                       if key in data}
    header = (f"# A {base.kind} profile started from {base.name} by `gpusim profiles new`.\n"
              f"# Edit every value for your device (units are in the names: _gib, _gb_s, "
              f"_mhz, _tflops, _w),\n# replace each TODO source, then run "
              f"`gpusim profiles check {path}`.\n")
    return header + yaml.safe_dump(data, sort_keys=False, width=100)
