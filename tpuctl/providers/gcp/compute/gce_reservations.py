"""`up --reservation` through Compute Engine: which kind of reservation it is, read from Google in the zone tried
(gce.py then sends RESERVATION_BOUND, or STANDARD with the SPECIFIC affinity alone: gce_requests.build_scheduling)."""
from __future__ import annotations

import dataclasses

from ....core.errors import ErrorKind, Scope, TpuctlError
from ....core.models import ClusterSpec
from ...google import clients
from ...google.operations import call, get_or_none
from .gce_errors import enum
from .gce_requests import reservation_parts


def reservation_bound(spec: ClusterSpec, zone: str) -> bool:
    """Whether --reservation is one a RESERVATION_BOUND VM consumes: of the dense deployment type (compute_v1
    Reservation.deployment_type DENSE), or the reservation a calendar-mode future reservation delivers into
    (FutureReservation.reservation_mode CALENDAR, its reservation_name ours). gcloud's flag help draws the line
    there (command_lib/compute/instances/flags.py); any other is consumed through STANDARD and a SPECIFIC
    affinity. A reservation is zonal: one not in this zone is this zone's failure, and `up` tries the next."""
    project, name = reservation_parts(spec)
    r = get_or_none(clients.compute("ReservationsClient").get, project=project, zone=zone, reservation=name,
                    what=f"read reservation {spec.reservation}")
    if r is None:
        raise TpuctlError(ErrorKind.INPUT, f"reservation {spec.reservation} is not in {zone}",
                          "give --zone the reservation's zone (`gcloud compute reservations list`), or name a "
                          "shared one as projects/P/reservations/R", Scope.ZONE)
    if enum(r.deployment_type) == "DENSE":
        return True
    try:
        futures = call(lambda: list(clients.compute("FutureReservationsClient").list(project=project, zone=zone)),
                       what="list future reservations")
    except TpuctlError as e:
        if e.kind is not ErrorKind.PERMISSION:
            raise
        return False   # cannot tell: STANDARD, which Google refuses in words up shows if it is wrong
    return any(f.reservation_name == name and enum(f.reservation_mode) == "CALENDAR" for f in futures)

def resolved(spec: ClusterSpec, zone: str) -> ClusterSpec:
    """The spec with what only Google can say filled in (reservation_bound), for this zone."""
    if not spec.reservation or spec.reservation_bound:
        return spec
    return dataclasses.replace(spec, reservation_bound=reservation_bound(spec, zone))
