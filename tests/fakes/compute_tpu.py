"""The Compute Engine fake's TPU half (mixed into FakeCompute): TPU machine types, instance templates, resource
policies with a workload policy, zonal instance group managers with their managed instances, and regional
operations. Sources are ../../../shared/GCE_TPU_FACTS.md's (§ numbers), which cite the Compute discovery document
(compute.v1.json rev. 20261106), google-cloud-compute 1.57 and Google's docs; each behaviour names its own.

Knobs a test sets (all reset by the `cloud` fixture through reset_tpu()):
  stockout_zones      zones with no TPU capacity: a VM insert's operation ends ZONE_RESOURCE_POOL_EXHAUSTED; a MIG
                      keeps its VMs CREATING and says why in listErrors / lastAttempt (§9); a bulk MIG waits (§3)
  http_error_fields   whether a failed operation carries httpErrorStatusCode/httpErrorMessage (§9: the client raises
                      only with both; which Google sends for each failure is not documented: tests run both ways)
  agent_worker_number whether a TPU VM's metadata has `agent-worker-number` (UNVERIFIED on Compute Engine, §5: the
                      hosts boot either way); a set of worker ids: those workers' VMs only (both shapes in one slice)
  on_preempt          what a MIG does when one VM of a slice is preempted (UNVERIFIED, §3): "repair" (the default
                      REPAIR action recreates it) or "nothing" (it stays TERMINATED)
  flex_wait           seconds a flex-start request waits for capacity before its VMs are made
  mig_refusal         (where, code, message): Google refuses to make a MIG's VMs for a reason other than capacity
                      (a machine type the zone lacks, a bad reservation, a service account the caller may not use, a
                      topology the policy cannot hold), said where `where` names: "lastAttempt" (each managed
                      instance's lastAttempt.errors, and listErrors), "bulk" (a bulk MIG's status.bulkInstanceOperation.
                      lastProgressCheck.error) or "topology" (status.appliedAcceleratorTopologies[] FAILED with
                      stateDetails.error). The MIG keeps trying, as a real one does (§3 "States you can observe")
  mig_refusal_zones   the zones mig_refusal applies in (empty: every zone)
  machine_missing_zones  zones without the TPU machine types: a VM insert there is refused at once (a 400, §9)
  workers_against_names  a MIG's worker ids (tpu-env TPU_WORKER_ID) run against its VMs' name order
  flex_polls          a single flex-start VM with a wait of >= 90 s is PENDING for this many reads of it (or of its
                      insert operation), standing for its wait (instance-lifecycle, §4)
  flex_no_capacity    zones where that wait ends without capacity: Compute Engine deletes the VM (§4)
  flex_op_waits       whether the insert operation stays RUNNING while the VM is PENDING, ending in an error when
                      the VM is deleted (UNVERIFIED either way, §4: tests run both ways)
"""
from __future__ import annotations

import random
import string
import time

TPU_MACHINES = {"tpu7x-standard-4t": 4, "ct6e-standard-1t": 1, "ct6e-standard-4t": 4, "ct6e-standard-8t": 8,
                "ct5p-hightpu-4t": 4}
_P = r"^/compute/v1/projects/(?P<project>[^/]+)"
ROUTES = [
    ("GET", _P + r"/zones/(?P<zone>[^/]+)/machineTypes/(?P<name>[^/]+)$", "machine_type"),
    ("POST", _P + r"/global/instanceTemplates$", "tpl_insert"),
    ("GET", _P + r"/global/instanceTemplates$", "tpl_list"),
    ("GET", _P + r"/global/instanceTemplates/(?P<name>[^/]+)$", "tpl_get"),
    ("DELETE", _P + r"/global/instanceTemplates/(?P<name>[^/]+)$", "tpl_delete"),
    ("POST", _P + r"/regions/(?P<region>[^/]+)/resourcePolicies$", "rp_insert"),
    ("GET", _P + r"/regions/(?P<region>[^/]+)/resourcePolicies/(?P<name>[^/]+)$", "rp_get"),
    ("DELETE", _P + r"/regions/(?P<region>[^/]+)/resourcePolicies/(?P<name>[^/]+)$", "rp_delete"),
    ("GET", _P + r"/aggregated/resourcePolicies$", "rp_aggregated"),
    ("GET", _P + r"/regions/(?P<region>[^/]+)/operations/(?P<op>[^/]+)$", "region_operation"),
    ("POST", _P + r"/zones/(?P<zone>[^/]+)/instanceGroupManagers$", "mig_insert"),
    ("GET", _P + r"/zones/(?P<zone>[^/]+)/instanceGroupManagers/(?P<name>[^/]+)$", "mig_get"),
    ("DELETE", _P + r"/zones/(?P<zone>[^/]+)/instanceGroupManagers/(?P<name>[^/]+)$", "mig_delete"),
    # listManagedInstances is a POST, listErrors a GET (§3 "States you can observe")
    ("POST", _P + r"/zones/(?P<zone>[^/]+)/instanceGroupManagers/(?P<name>[^/]+)/listManagedInstances$", "mig_managed"),
    ("GET", _P + r"/zones/(?P<zone>[^/]+)/instanceGroupManagers/(?P<name>[^/]+)/listErrors$", "mig_errors"),
    ("GET", _P + r"/aggregated/instanceGroupManagers$", "mig_aggregated"),
    ("GET", _P + r"/zones/(?P<zone>[^/]+)/reservations/(?P<name>[^/]+)$", "reservation_get"),
    ("GET", _P + r"/zones/(?P<zone>[^/]+)/futureReservations$", "future_list"),
]
MUTATING = {"tpl_insert", "tpl_delete", "rp_insert", "rp_delete", "mig_insert", "mig_delete"}
STOCKOUT = ("ZONE_RESOURCE_POOL_EXHAUSTED",
            "The zone 'projects/{project}/zones/{zone}' does not have enough resources available to fulfill the "
            "request.  Try a different zone, or try again later.")   # §9, troubleshooting-resource-availability
# Boot disk types per TPU machine series: Google's "TPU storage options" table (tpu/docs/storage-options-compute):
# TPU7x and v6e take Hyperdisk Balanced or Hyperdisk ML, v5p Balanced PD or Hyperdisk ML. A TPU VM's disk without
# one of them is refused here: compute_v1's default "depends on the machine series" and names no TPU series, so a
# request without a type is one whose outcome nothing documents.
DISK_TYPES = {"tpu7x": ("hyperdisk-balanced", "hyperdisk-ml"), "ct6e": ("hyperdisk-balanced", "hyperdisk-ml"),
              "ct5p": ("pd-balanced", "hyperdisk-ml")}
# Google's TPU image families (§2); a TPU VM booted from another image has no simulated host.
ACCEL_IMAGES = ("ubuntu-os-accelerator-images",)


def _suffix() -> str:
    """A MIG's VM is its baseInstanceName, a hyphen and four random characters (§3 "Instance names")."""
    return "".join(random.choices(string.ascii_lowercase + string.digits, k=4))


class TpuCompute:
    # state, set up by reset_tpu()
    templates: dict
    policies: dict
    migs: dict
    bodies: list

    def reset_tpu(self):
        self.templates = {}    # (project, name) -> InstanceTemplate
        self.policies = {}     # (project, region, name) -> ResourcePolicy
        self.migs = {}         # (project, zone, name) -> {"mig": ..., "managed": [...], "errors": [...], "since"}
        self.bodies = []       # (action, body) of every request with a body: the field-name test reads them
        self.stockout_zones = set()
        self.http_error_fields = False
        self.agent_worker_number = False
        self.on_preempt = "repair"
        self.flex_wait = 0.0
        self.mig_refusal = None
        self.mig_refusal_zones = set()
        self.workers_against_names = False
        self.machine_missing_zones = set()   # zones whose catalog lacks the TPU machine types: a VM insert is a 400
        self.reservations = {}          # (project, zone, name) -> Reservation (add_reservation)
        self.future_reservations = []   # (project, zone, FutureReservation)
        self.flex_polls = 3
        self.flex_no_capacity = set()
        self.flex_op_waits = False
        self.flex = {}   # (project, zone, name) -> {"left": reads before the wait ends, "op": its insert operation}

    # -- helpers --------------------------------------------------------------------------------------------------
    def _failed(self, op, code, message, status=503):
        """An operation's error (§9 Operation.error); httpError* only when the test asks for them."""
        op["error"] = {"errors": [{"code": code, "message": message}]}
        if self.http_error_fields:
            op["httpErrorStatusCode"], op["httpErrorMessage"] = status, "SERVICE UNAVAILABLE"

    def _regional_op(self, project, region, kind, target, finish):
        code, op = self._op(project, "-", kind, target, finish)
        for o in (op, self.ops[op["name"]]):
            o.pop("zone", None)
            o["region"] = f"projects/{project}/regions/{region}"
        return code, op

    def do_region_operation(self, body, project, region, op):
        return self.do_operation(body, project, region, op)

    def do_machine_type(self, body, project, zone, name):
        """machineTypes.get; `accelerators[]` carries the chips (§1 "Chips per VM from the API")."""
        if name not in TPU_MACHINES:
            return self._error(404, "notFound", f"The resource 'projects/{project}/zones/{zone}/machineTypes/"
                                                f"{name}' was not found")
        return 200, {"kind": "compute#machineType", "name": name, "zone": zone, "accelerators": [
            {"guestAcceleratorType": name.split("-")[0], "guestAcceleratorCount": TPU_MACHINES[name]}]}

    def check_tpu_instance(self, props, zone, project=None):
        """What Compute Engine refuses of a TPU VM, at once (a 400 on the insert, §9): a machine type the zone does not
        have; a TPU VM that would live-migrate (onHostMaintenance must be TERMINATE, §2)."""
        machine = props["machineType"].rsplit("/", 1)[-1]
        if machine.startswith("ct5lp-"):   # v5e is not on Compute Engine (§1, §9)
            return self._error(400, "invalid", f"This user agent is not allowed to use the machine type [{machine}].")
        if machine not in TPU_MACHINES:
            return None
        if zone in self.machine_missing_zones:   # the text gcloud's own regex matches (§9 "Machine type not in zone")
            return self._error(400, "invalid", f"Invalid value for field 'resource.machineType': "
                                               f"'zones/{zone}/machineTypes/{machine}'. Machine type with name "
                                               f"'{machine}' does not exist in zone '{zone}'.")
        if props.get("scheduling", {}).get("onHostMaintenance") != "TERMINATE":
            return self._error(400, "invalid", "Instances with guest accelerators do not support live migration.")
        return self.check_tpu_disk(props, machine, template=False) or \
            (self.check_reservation(props, project, zone) if project else None)

    def check_tpu_disk(self, props, machine, template):
        """The boot disk's type is one the series takes (DISK_TYPES); an instance names it by full or partial URL,
        a template by bare name (compute_v1 AttachedDiskInitializeParams.disk_type). The refusal texts are
        UNVERIFIED."""
        kinds = DISK_TYPES[machine.split("-")[0]]
        sent = props.get("disks", [{}])[0].get("initializeParams", {}).get("diskType", "")
        if template and "/" in sent:
            return self._error(400, "invalid", f"Invalid value for field 'resource.properties.disks[0]."
                                               f"initializeParams.diskType': '{sent}'. Specify a disk type name.")
        if not template and sent and "/diskTypes/" not in sent:
            return self._error(400, "invalid", f"Invalid value for field 'resource.disks[0].initializeParams."
                                               f"diskType': '{sent}'. Must be a URL to a valid disk type.")
        if sent.rsplit("/", 1)[-1] not in kinds:
            return self._error(400, "invalid", f"[{machine}] does not support disk type "
                                               f"[{sent.rsplit('/', 1)[-1] or 'the default'}]; use one of "
                                               f"{', '.join(kinds)}.")
        return None

    def boot_tpu_vm(self, project, zone, name, props, worker, peers):
        """A TPU VM's host: boots from its start-up script, its metadata carrying tpu-env's TPU_WORKER_ID and
        worker-network-endpoints as hostnames (§5, cluster-toolkit PR #6351), and agent-worker-number only where
        the test says so (UNVERIFIED)."""
        if self.hosts is None:
            return
        items = {i["key"]: i["value"] for i in props.get("metadata", {}).get("items", [])}
        source = props.get("disks", [{}])[0].get("initializeParams", {}).get("sourceImage", "")
        assert source.startswith("projects/ubuntu-os-accelerator-images/"), source
        sa = props.get("serviceAccounts", [{}])[0].get("email", "default")
        sa = f"{self.project_number}-compute@developer.gserviceaccount.com" if sa == "default" else sa
        attributes = {"worker-network-endpoints": ",".join(peers), "tpuctl-slice": items.get("tpuctl-slice", "0")}
        self.hosts.boot(f"{project}/{zone}/{name}", items.get("startup-script", ""), 1, sa, "",
                        kind="gce-tpu", image="ubuntu-accel", tpu_env={"TPU_WORKER_ID": worker},
                        attributes=attributes, first_worker=worker, hostname=name,
                        agent_worker_number=self.has_worker_number(worker))

    def has_worker_number(self, worker: int) -> bool:
        """Whether worker `worker`'s VM metadata has `agent-worker-number` (the knob, above)."""
        knob = self.agent_worker_number
        return worker in knob if isinstance(knob, set) else bool(knob)

    # -- reservations (read only: tests make them) -------------------------------------------------------------------
    def add_reservation(self, project, zone, name, kind="default"):
        """A reservation of `kind`: "dense" (Reservation.deploymentType DENSE), "calendar" (the reservation a
        calendar-mode future reservation delivers into: FutureReservation.reservationMode CALENDAR, reservationName),
        or "default" (neither). compute_v1 1.57 field names."""
        r = {"kind": "compute#reservation", "name": name, "zone": zone, "status": "READY",
             "specificReservationRequired": True}
        if kind == "dense":
            r["deploymentType"] = "DENSE"
        self.reservations[(project, zone, name)] = r
        if kind == "calendar":
            self.future_reservations.append((project, zone, {"kind": "compute#futureReservation", "name": f"fr-{name}",
                                                             "reservationMode": "CALENDAR", "reservationName": name}))

    def bound_reservation(self, project, zone, affinity):
        """The reservation a SPECIFIC affinity names (its value: a name, or projects/P/reservations/R), and whether
        it is one RESERVATION_BOUND may consume (calendar-mode or dense: gcloud instances/flags.py)."""
        value = (affinity.get("values") or [""])[0]
        parts = value.split("/")
        key = (parts[1], zone, parts[3]) if len(parts) == 4 else (project, zone, value)
        r = self.reservations.get(key)
        calendar = any(p == key[0] and z == zone and f["reservationName"] == key[2]
                       for p, z, f in self.future_reservations)
        return r, r is not None and (r.get("deploymentType") == "DENSE" or calendar)

    def check_reservation(self, props, project, zone):
        """A VM that names a reservation: it must be in the zone; RESERVATION_BOUND only against a calendar-mode or
        dense one. The texts are UNVERIFIED."""
        affinity = props.get("reservationAffinity") or {}
        model = props.get("scheduling", {}).get("provisioningModel", "STANDARD")
        if affinity.get("consumeReservationType") != "SPECIFIC_RESERVATION":
            return None
        r, bound = self.bound_reservation(project, zone, affinity)
        if r is None:
            return self._error(400, "invalid", f"Reservation {affinity['values'][0]} not found in zone {zone}.")
        if model == "RESERVATION_BOUND" and not bound:
            return self._error(400, "invalid", "RESERVATION_BOUND provisioning model requires a reservation in "
                                               "calendar mode or of the dense deployment type.")
        return None

    def do_reservation_get(self, body, project, zone, name):
        r = self.reservations.get((project, zone, name))
        if r is None:
            return self._error(404, "notFound", f"The resource 'projects/{project}/zones/{zone}/reservations/{name}' "
                                                "was not found")
        return 200, r

    def do_future_list(self, body, project, zone):
        return 200, {"items": [f for p, z, f in self.future_reservations if p == project and z == zone]}

    # -- a single flex-start VM (§4) -------------------------------------------------------------------------------
    @staticmethod
    def flex_pending(body):
        wait = int(body.get("params", {}).get("requestValidForDuration", {}).get("seconds", 0))
        return body.get("scheduling", {}).get("provisioningModel") == "FLEX_START" and wait >= 90

    def flex_vm(self, key, inst):
        project, zone, name = key
        inst["status"] = "PENDING"   # Instance.status PENDING: "waiting for available capacity from DWS" (§6)
        self.instances[key] = inst
        code, op = self._op(project, zone, "insert", name, lambda: None)
        if self.flex_op_waits:
            self.ops[op["name"]].update(status="RUNNING", at=float("inf"))
            op["status"] = "RUNNING"
        self.flex[key] = {"left": self.flex_polls, "op": op["name"]}
        return code, op

    def flex_tick_op(self, op_name):
        key = next((k for k, f in self.flex.items() if f["op"] == op_name), None)
        if key is not None:
            self.flex_tick(key)

    def flex_tick(self, key):
        """One read of a PENDING flex-start VM: when its wait is over it runs, or, without capacity in its zone, is
        deleted ("Otherwise, you encounter an error and Compute Engine deletes the Flex-start VM", §4). The
        insert's error code then is UNVERIFIED: a made-up one, so that tpuctl cannot depend on it."""
        f = self.flex.get(key)
        if f is None:
            return
        f["left"] -= 1
        if f["left"] > 0:
            return
        del self.flex[key]
        op = self.ops[f["op"]]
        project, zone, name = key
        if zone in self.flex_no_capacity:
            self.instances.pop(key, None)
            if op["status"] != "DONE":
                self._failed(op, "UNVERIFIED_FLEX_WAIT_ENDED", "The request for capacity expired.")
        else:
            inst = self.instances[key]
            inst["status"] = "RUNNING"
            self.boot_tpu_vm(project, zone, name, inst, 0, [name])
        if op["status"] != "DONE":
            op["status"] = "DONE"
            op.pop("finish", None)

    # -- instance templates (global: §3) --------------------------------------------------------------------------
    def do_tpl_insert(self, body, project):
        key = (project, body["name"])
        if key in self.templates:
            return self._error(409, "alreadyExists", f"The resource 'projects/{project}/global/instanceTemplates/"
                                                     f"{body['name']}' already exists")
        machine = body.get("properties", {}).get("machineType", "")
        if "/" in machine:   # "only accepts a machine type name ... INTERNAL_ERROR" (§2)
            return self._error(500, "internalError", "Internal error. Please try again or contact Google Support.")
        if machine in TPU_MACHINES:
            refused = self.check_tpu_disk(body["properties"], machine, template=True)
            if refused:
                return refused
        self.templates[key] = dict(body, kind="compute#instanceTemplate", id=str(next(self._ids)),
                                   selfLink=f"projects/{project}/global/instanceTemplates/{body['name']}")
        return self._global_op(project, "insert", body["name"], lambda: None)

    def do_tpl_get(self, body, project, name):
        t = self.templates.get((project, name))
        if t is None:
            return self._error(404, "notFound", f"The resource 'projects/{project}/global/instanceTemplates/{name}' "
                                                "was not found")
        return 200, t

    def do_tpl_list(self, body, project):
        return 200, {"items": [t for (p, _), t in self.templates.items() if p == project]}

    def _in_use(self, project, link):
        return next((m["mig"]["name"] for (p, _, _), m in self.migs.items() if p == project
                     and link in (m["mig"].get("instanceTemplate", ""),
                                  m["mig"].get("resourcePolicies", {}).get("workloadPolicy", ""))), None)

    def do_tpl_delete(self, body, project, name):
        if (project, name) not in self.templates:
            return self.do_tpl_get(body, project, name)
        user = self._in_use(project, f"projects/{project}/global/instanceTemplates/{name}")
        if user:   # the generic resource-in-use refusal (§3 "Delete": UNVERIFIED text)
            return self._error(400, "resourceInUseByAnotherResource", f"The instance_template resource "
                                                                      f"'{name}' is already being used by '{user}'")
        return self._global_op(project, "delete", name, lambda: self.templates.pop((project, name), None))

    # -- resource policies (regional: §3 "Workload policy") -------------------------------------------------------
    def do_rp_insert(self, body, project, region):
        key = (project, region, body["name"])
        if key in self.policies:
            return self._error(409, "alreadyExists", f"The resource 'projects/{project}/regions/{region}/"
                                                     f"resourcePolicies/{body['name']}' already exists")
        wp = body.get("workloadPolicy") or {}
        if wp.get("type") not in ("HIGH_THROUGHPUT", "HIGH_AVAILABILITY"):   # WorkloadPolicy.Type (compute_v1)
            return self._error(400, "invalid", "Invalid value for field 'resource.workloadPolicy.type'")
        if wp.get("acceleratorTopology") and wp.get("type") != "HIGH_THROUGHPUT":
            return self._error(400, "invalid", "Accelerator topology is only supported for high throughput workload "
                                               "policies.")
        self.policies[key] = dict(body, kind="compute#resourcePolicy", id=str(next(self._ids)), region=region,
                                  status="READY")
        return self._regional_op(project, region, "insert", body["name"], lambda: None)

    def do_rp_get(self, body, project, region, name):
        p = self.policies.get((project, region, name))
        if p is None:
            return self._error(404, "notFound", f"The resource 'projects/{project}/regions/{region}/resourcePolicies/"
                                                f"{name}' was not found")
        return 200, p

    def do_rp_delete(self, body, project, region, name):
        if (project, region, name) not in self.policies:
            return self.do_rp_get(body, project, region, name)
        user = self._in_use(project, f"projects/{project}/regions/{region}/resourcePolicies/{name}")
        if user:
            return self._error(400, "resourceInUseByAnotherResource", f"The resource_policy resource '{name}' is "
                                                                      f"already being used by '{user}'")
        return self._regional_op(project, region, "delete", name,
                                 lambda: self.policies.pop((project, region, name), None))

    def do_rp_aggregated(self, body, project):
        items = {}
        for (p, r, _), pol in self.policies.items():
            if p == project:
                items.setdefault(f"regions/{r}", {"resourcePolicies": []})["resourcePolicies"].append(pol)
        return 200, {"items": items}

    # -- instance group managers (zonal: §3 "MIG") ----------------------------------------------------------------
    def do_mig_insert(self, body, project, zone):
        key = (project, zone, body["name"])
        if key in self.migs:
            return self._error(409, "alreadyExists", f"The resource 'projects/{project}/zones/{zone}/"
                                                     f"instanceGroupManagers/{body['name']}' already exists")
        tname = body.get("instanceTemplate", "").rsplit("/", 1)[-1]
        tpl = self.templates.get((project, tname))
        if tpl is None:
            return self._error(404, "notFound", f"The resource 'projects/{project}/global/instanceTemplates/{tname}' "
                                                "was not found")
        props = tpl["properties"]
        wp = body.get("resourcePolicies", {}).get("workloadPolicy", "")
        parts = wp.split("/")
        if wp and (project, parts[-3], parts[-1]) not in self.policies:
            return self._error(404, "notFound", f"The resource '{wp}' was not found")
        if props["machineType"] in TPU_MACHINES and body.get("targetSize", 0) > 1 and not wp:
            # "a workload policy is required" for a multi-host TPU MIG (about-workload-policies, §1)
            return self._error(400, "invalid", "A workload policy is required for a multi-host TPU slice.")
        refused = self.check_reservation(props, project, zone)
        if refused:
            return refused
        model = props.get("scheduling", {}).get("provisioningModel", "STANDARD")
        bulk = body.get("targetSizePolicy", {}).get("mode") == "BULK"
        if bulk and model not in ("FLEX_START", "RESERVATION_BOUND"):   # about-bulk-mode limitations (§3)
            return self._error(400, "invalid", "Bulk mode supports only the reservation-bound and flex-start "
                                               "provisioning models.")
        if model == "FLEX_START" and body.get("instanceLifecyclePolicy", {}).get("defaultActionOnFailure") != \
                "DO_NOTHING":
            return self._error(400, "invalid", "Repairs must be turned off for a MIG whose template uses flex-start.")
        mig = dict(body, kind="compute#instanceGroupManager", id=str(next(self._ids)), zone=zone,
                   baseInstanceName=body.get("baseInstanceName", body["name"]))
        self.migs[key] = {"mig": mig, "managed": [], "errors": [], "since": time.monotonic(), "bulk": bulk,
                          "model": model}

        def finish():
            if key in self.migs:
                self._grow(key)
        return self._op(project, zone, "insert", body["name"], finish)

    def _grow(self, key):
        """Make the MIG's missing VMs where the zone has capacity; else leave managed instances CREATING with the
        stockout as their last attempt's error and in listErrors (§9 Stockout). A bulk MIG makes none until all can
        be made (§3 "Atomic creation"); a flex-start one waits flex_wait seconds for capacity."""
        project, zone, name = key
        m = self.migs[key]
        want = int(m["mig"].get("targetSize", 0))
        props = self.templates[(project, m["mig"]["instanceTemplate"].rsplit("/", 1)[-1])]["properties"]
        base = m["mig"]["baseInstanceName"]
        while len(m["managed"]) < want:
            m["managed"].append({"name": f"{base}-{_suffix()}", "currentAction": "CREATING", "worker": None})
        if self.workers_against_names and all(mi["worker"] is None for mi in m["managed"]):
            # worker ids in creation order, which the random suffixes need not follow (§3 "Instance names"): here
            # made to disagree with name order outright
            m["managed"].sort(key=lambda mi: mi["name"], reverse=True)
        if self.mig_refusal and (not self.mig_refusal_zones or zone in self.mig_refusal_zones):
            self._refuse(m)
            return
        waiting = m["model"] == "FLEX_START" and time.monotonic() - m["since"] < self.flex_wait
        if zone in self.stockout_zones or waiting:
            if zone in self.stockout_zones:
                code, message = STOCKOUT[0], STOCKOUT[1].format(project=project, zone=zone)
                for mi in m["managed"]:
                    if mi["currentAction"] == "CREATING":
                        mi["lastAttempt"] = {"errors": {"errors": [{"code": code, "message": message}]}}
                if m["bulk"]:   # a bulk MIG says why it waits in its progress check (§3 "Atomic creation")
                    m["progress_error"] = {"errors": [{"code": code, "message": message}]}
                else:
                    m["errors"] = [{"error": {"code": code, "message": message},
                                    "instanceActionDetails": {"action": "CREATING", "instance": mi["name"]},
                                    "timestamp": "2026-11-28T00:00:00Z"} for mi in m["managed"]]
            return
        peers = [mi["name"] for mi in m["managed"]]
        for worker, mi in enumerate(m["managed"]):
            if mi["currentAction"] not in ("CREATING", "RECREATING"):
                continue
            worker = mi["worker"] if mi["worker"] is not None else worker   # a repaired VM keeps its place
            mi.update(currentAction="NONE", worker=worker)
            mi.pop("lastAttempt", None)
            # Google's own metadata beside the template's: tpu-env (TPU_WORKER_ID) and worker-network-endpoints
            # as hostnames (§5, cluster-toolkit PR #6351), as instance metadata items, which is what the metadata
            # server serves as instance/attributes/ (compute/docs/metadata/overview: custom metadata)
            google = [{"key": "tpu-env", "value": f"TPU_WORKER_ID: '{worker}'\nTOPOLOGY: 'unused'"},
                      {"key": "worker-network-endpoints", "value": ",".join(peers)}]
            if self.has_worker_number(worker):
                google.append({"key": "agent-worker-number", "value": str(worker)})
            self.instances[(project, zone, mi["name"])] = dict(
                props, name=mi["name"], zone=zone, status="RUNNING", id=str(next(self._ids)),
                metadata={"items": props.get("metadata", {}).get("items", []) + google},
                machineType=f"zones/{zone}/machineTypes/{props['machineType']}",
                networkInterfaces=[dict(n, networkIP=f"10.0.{len(self.instances) % 250}.{worker + 2}")
                                   for n in props.get("networkInterfaces", [])])
            self.boot_tpu_vm(project, zone, mi["name"], props, worker, peers)
        m["errors"] = []
        m.pop("progress_error", None)

    def _refuse(self, m):
        """mig_refusal: the VMs stay CREATING (a MIG retries, so without reading these fields a client sees
        CREATING until its own deadline), with the error where Google puts it (compute_v1 ManagedInstance.
        last_attempt.errors, InstanceGroupManagerStatusBulkInstanceOperation.last_progress_check.error,
        InstanceGroupManagerStatusAcceleratorTopology.state/state_details; §3 "States you can observe"). The codes
        tests use are UNVERIFIED: no captured TPU MIG refusal was found."""
        where, code, message = self.mig_refusal
        errors = {"errors": [{"code": code, "message": message}]}
        if where == "lastAttempt":
            for mi in m["managed"]:
                mi["lastAttempt"] = {"errors": errors}
            m["errors"] = [{"error": {"code": code, "message": message},
                            "instanceActionDetails": {"action": "CREATING", "instance": mi["name"]},
                            "timestamp": "2026-11-28T00:00:00Z"} for mi in m["managed"]]
        elif where == "bulk":
            m["progress_error"] = errors
        else:
            m["topology_error"] = errors

    def _mig_or_404(self, project, zone, name):
        m = self.migs.get((project, zone, name))
        if m is None:
            return None, self._error(404, "notFound", f"The resource 'projects/{project}/zones/{zone}/"
                                                      f"instanceGroupManagers/{name}' was not found")
        return m, None

    def _tick_migs(self):
        """Each request: MIGs still short of VMs try again (a stockout that ended, a flex-start wait that passed)."""
        for key, m in list(self.migs.items()):
            if any(mi["currentAction"] in ("CREATING", "RECREATING") for mi in m["managed"]):
                self._grow(key)

    def do_mig_get(self, body, project, zone, name):
        m, err = self._mig_or_404(project, zone, name)
        if err:
            return err
        self._tick_migs()
        busy = sum(mi["currentAction"] != "NONE" for mi in m["managed"])
        statuses = {}
        for mi in m["managed"]:
            inst = self.instances.get((project, zone, mi["name"]))
            s = (inst["status"] if inst else "PENDING").lower()
            statuses[s] = statuses.get(s, 0) + 1
        status = {"isStable": busy == 0, "currentInstanceStatuses": statuses}
        if m["bulk"]:   # InstanceGroupManagerStatusBulkInstanceOperation (§3 "Atomic creation")
            check = {"timestamp": "2026-11-28T00:00:00Z"}
            if m.get("progress_error"):
                check["error"] = m["progress_error"]
            status["bulkInstanceOperation"] = {"inProgress": busy > 0, "lastProgressCheck": check}
        wp = m["mig"].get("resourcePolicies", {}).get("workloadPolicy", "").split("/")
        policy = self.policies.get((project, wp[-3], wp[-1])) if len(wp) >= 3 else None
        topology = (policy or {}).get("workloadPolicy", {}).get("acceleratorTopology")
        if topology:   # InstanceGroupManagerStatusAcceleratorTopology: ACTIVATING while made, ACTIVE when all run
            applied = {"acceleratorTopology": topology, "state": "ACTIVE" if busy == 0 else "ACTIVATING"}
            if m.get("topology_error"):
                applied.update(state="FAILED", stateDetails={"error": m["topology_error"],
                                                             "timestamp": "2026-11-28T00:00:00Z"})
            status["appliedAcceleratorTopologies"] = [applied]
        return 200, dict(m["mig"], status=status,
                         currentActions={"creating": busy, "none": len(m["managed"]) - busy})

    def do_mig_managed(self, body, project, zone, name):
        """listManagedInstances: each VM's currentAction and instanceStatus (and `instance` once it exists)."""
        m, err = self._mig_or_404(project, zone, name)
        if err:
            return err
        self._tick_migs()
        out = []
        for mi in m["managed"]:
            inst = self.instances.get((project, zone, mi["name"]))
            entry = {"name": mi["name"], "currentAction": mi["currentAction"], "id": str(abs(hash(mi["name"])))}
            if inst is not None:
                entry["instance"] = f"https://www.googleapis.com/compute/v1/projects/{project}/zones/{zone}/" \
                                    f"instances/{mi['name']}"
                entry["instanceStatus"] = inst["status"]
            if "lastAttempt" in mi:
                entry["lastAttempt"] = mi["lastAttempt"]
            out.append(entry)
        return 200, {"managedInstances": out}

    def do_mig_errors(self, body, project, zone, name):
        m, err = self._mig_or_404(project, zone, name)
        if err:
            return err
        return 200, {"items": list(m["errors"])}

    def do_mig_aggregated(self, body, project):
        items = {}
        for (p, z, _), m in self.migs.items():
            if p == project:
                items.setdefault(f"zones/{z}", {"instanceGroupManagers": []})["instanceGroupManagers"].append(
                    dict(m["mig"], status={"isStable": all(mi["currentAction"] == "NONE" for mi in m["managed"])}))
        return 200, {"items": items}

    def do_mig_delete(self, body, project, zone, name):
        """Deletes the group and its VMs (§3 "Delete")."""
        key = (project, zone, name)
        m, err = self._mig_or_404(project, zone, name)
        if err:
            return err
        for mi in m["managed"]:
            mi["currentAction"] = "DELETING"

        def finish():   # its VMs first, then the group: nothing reads a group gone and its VMs still there
            for mi in self.migs.get(key, {}).get("managed", []):
                self.instances.pop((project, zone, mi["name"]), None)
                if self.hosts is not None:
                    self.hosts.power_off(f"{project}/{zone}/{mi['name']}")
            self.migs.pop(key, None)
        return self._op(project, zone, "delete", name, finish)

    # -- preemption (test-driven) ---------------------------------------------------------------------------------
    def preempt(self, project, zone, name):
        """A Spot VM preempted: with the STOP action it is TERMINATED (§6); a zoneOperations record
        compute.instances.preempted stays. In a MIG, on_preempt decides what the MIG does (UNVERIFIED, §3)."""
        with self.lock:
            inst = self.instances[(project, zone, name)]
            action = inst.get("scheduling", {}).get("instanceTerminationAction", "STOP")
            if self.hosts is not None:
                self.hosts.power_off(f"{project}/{zone}/{name}")
            code, op = self._op(project, zone, "compute.instances.preempted", name, lambda: None)
            if action == "DELETE":
                self.instances.pop((project, zone, name))
            else:
                inst["status"] = "TERMINATED"
            for key, m in self.migs.items():
                for mi in m["managed"]:
                    if mi["name"] == name and self.on_preempt == "repair" and m["model"] != "FLEX_START":
                        self.instances.pop((project, zone, name), None)
                        mi["currentAction"] = "RECREATING"
                    elif mi["name"] == name and action == "DELETE":
                        m["managed"].remove(mi)
                        break
