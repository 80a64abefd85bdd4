"""What a training run costs: to rent (cloud on-demand GPU-hours) and to own (the purchase
spread over the hardware's lifetime, plus the electricity the run draws at the facility).

Prices come from the profiles, each with its date and source; the facility figures below are
parameters with sourced defaults.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from gpusim import units
from gpusim.hardware.profile import DeviceProfile
from gpusim.report import TrainingEstimate

HOURS_PER_YEAR = 24 * 365

# Defaults, with where they come from.
ELECTRICITY_USD_PER_KWH = 0.08
ELECTRICITY_SOURCE = ("US EIA average retail price to industrial customers, 2023: 8.06 cents; "
                      "commercial customers paid 12.4 cents in 2022")
PUE = 1.56
PUE_SOURCE = ("Uptime Institute Global Data Center Survey 2024 average; hyperscalers report "
              "about 1.1 (Google 2023: 1.10)")
LIFETIME_YEARS = 5.0
LIFETIME_SOURCE = ("server useful life in annual reports: Meta 5 years, Amazon 5 for its "
                   "AI-affected servers from 2025, Microsoft and Alphabet 6")


class Pricing(BaseModel):
    """The facility and the accounting the ownership cost assumes."""

    model_config = ConfigDict(frozen=True)

    electricity_usd_per_kwh: float = Field(ELECTRICITY_USD_PER_KWH, ge=0)
    pue: float = Field(PUE, ge=1, description="facility energy over IT energy")
    lifetime_years: float = Field(LIFETIME_YEARS, gt=0,
                                  description="years over which the purchase is spread")
    utilization: float = Field(1.0, gt=0, le=1,
                               description="share of the lifetime the hardware does work "
                                           "like this; idle years still cost")
    host_usd_per_gpu: float = Field(0.0, ge=0,
                                    description="server, network and rack per device")

    def host_assumption(self) -> str:
        """What a purchase includes besides the devices (--host-usd-per-gpu)."""
        return (f"plus ${self.host_usd_per_gpu:,.0f} per device for servers and network"
                if self.host_usd_per_gpu
                else "device prices only (no servers or network: --host-usd-per-gpu)")

    def assumptions(self) -> list[str]:
        host = self.host_assumption()
        return [
            f"cost to own: purchase spread over {self.lifetime_years:g} years at "
            f"{100 * self.utilization:.0f}% use ({LIFETIME_SOURCE}), {host}",
            f"electricity ${self.electricity_usd_per_kwh:.3f}/kWh ({ELECTRICITY_SOURCE}) "
            f"at PUE {self.pue:g} ({PUE_SOURCE})",
        ]


@dataclass(frozen=True)
class RunCost:
    """A run's price, rented and owned (USD); None where the profile lists no price."""

    cloud_usd: float | None
    cloud_usd_per_device_hour: float | None
    cloud_source: str | None
    purchase_usd: float | None  # every device of the run, with hosts
    purchase_source: str | None
    amortized_purchase_usd: float | None  # this run's share of the purchase
    facility_energy_kwh: float
    electricity_usd: float

    @property
    def ownership_usd(self) -> float | None:
        if self.amortized_purchase_usd is None:
            return None
        return self.amortized_purchase_usd + self.electricity_usd


def run_cost(result: TrainingEstimate, device: DeviceProfile,
             pricing: Pricing | None = None) -> RunCost:
    """Rent and own costs of ``result``, a run on ``result.num_gpus`` of ``device``."""
    pricing = pricing or Pricing()
    n = result.num_gpus
    hours = units.to_hours(result.time_to_train_s)
    facility_kwh = result.energy_kwh * pricing.pue
    electricity = facility_kwh * pricing.electricity_usd_per_kwh
    quote = device.purchase_price()
    purchase = amortized = None
    source = None
    if quote is not None:
        purchase = n * (quote.usd + pricing.host_usd_per_gpu)
        lifetime_h = pricing.lifetime_years * HOURS_PER_YEAR * pricing.utilization
        amortized = purchase * hours / lifetime_h
        when = f", {quote.date}" if quote.date else ""
        source = f"${quote.usd:,.0f} each, {quote.seller}{when}"
    return RunCost(
        cloud_usd=result.cost_usd,
        cloud_usd_per_device_hour=result.price_usd_per_hour,
        cloud_source=result.price_source,
        purchase_usd=purchase,
        purchase_source=source,
        amortized_purchase_usd=amortized,
        facility_energy_kwh=facility_kwh,
        electricity_usd=electricity,
    )
