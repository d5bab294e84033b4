"""``release build`` makes each build (:mod:`release.quantize.build`) and verifies it
(:mod:`release.check.verify`) as soon as it is made, so that a sweep's builds need not all be on disk at once and a
stopped sweep has already verified what it made."""

from __future__ import annotations

import functools
from pathlib import Path

from release.check.verify import REFERENCE_BUILD, Verifier, VerifyRequest
from release.core.config import BuildConfig
from release.core.device import libraries_loaded
from release.core.distributed import world
from release.core.output import progress
from release.inputs.fixture import fixture_reference
from release.inputs.source import remember_inputs
from release.quantize.build import Builder, BuildRequest
from release.quantize.recipes import ObserverPasses, observes_source


def run_builds(request: BuildRequest) -> bool:
    """Build every requested build from one load of the source and one calibration capture, then verify each
    against the fixture's reference (ModelOpt's own export, for a tiny fixture's source), else the RTN build; True
    when all checks passed. Under torchrun each rank makes and verifies its share."""
    fixtures = fixture_reference(request.source)  # before any work: a recorded reference that is gone is refused
    libraries_loaded()
    builder = Builder.prepare(request)
    # the reference first: in one process every other build is then verified against it as soon as it is made;
    # under torchrun a rank that does not make the reference verifies its builds once every rank is done
    builds = sorted(request.builds, key=lambda b: b.name != REFERENCE_BUILD)
    reference_ready = REFERENCE_BUILD not in {b.name for b in builds} or fixtures is not None
    verifier, ok, later = Verifier(builder.source), True, []

    def verification(build: BuildConfig, at: Path | None = None) -> VerifyRequest:
        return VerifyRequest.create(build.name, request.out, None, request.source, request.observations,
                                    require_reference=False, at=at)

    def verified(build: BuildConfig, at: Path) -> bool:
        return verifier(verification(build, at))

    mine = world().share(builds)
    observed = ObserverPasses(b.calibrator for b in mine if observes_source(b))
    with progress(f"{world().tag}builds", len(mine)) as bar:
        for build in mine:
            reference_ready |= build.name == REFERENCE_BUILD
            if reference_ready:  # verified before it replaces the old build: a kill meanwhile leaves that one whole
                ok &= bool(builder.make(build, observed, functools.partial(verified, build)))
            else:
                builder.make(build, observed)
                later.append(build)
            bar.advance()
    world().barrier()  # the RTN build, the others' reference, is in place
    for build in later:
        ok &= verifier(verification(build))
    if world().main:  # verify and eval on this dist find them without the options
        remember_inputs(request.out, request.source, request.observations)
    return world().all_true(ok)
