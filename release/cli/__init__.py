"""The ``release`` command line: each command validates its options and calls one stage function."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from release import __version__
from release.cli.base import (
    ALLOW_REVISION_MISMATCH,
    BASELINE,
    BUILDS,
    DIST,
    ENVIRONMENT,
    EXECUTOR,
    FORMAT,
    OBSERVATIONS,
    RESAMPLES,
    SOURCE,
    ReleaseGroup,
    max_gpu_memory_option,
    quiet_libraries,
)


@click.group(cls=ReleaseGroup, epilog=ENVIRONMENT, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="release")
@BUILDS
@click.pass_context
def main(ctx: click.Context) -> None:
    """Build, verify, document and publish FP8 builds of Cosmos3-Nano-Policy-DROID."""
    from release.core.distributed import join
    from release.core.io import cache_compiles
    from release.core.profile import begin, check_target

    quiet_libraries()
    cache_compiles()
    check_target()
    rank = join(ctx.invoked_subcommand).rank  # torchrun: the process group, before any work
    begin(str(ctx.invoked_subcommand), rank)


@main.command()
@click.argument("folder", type=click.Path(path_type=Path, file_okay=False))
def init(folder: Path) -> None:
    """Write a starter builds/ into FOLDER: release.yaml and the sweep's build files, to edit."""
    from release.core.builds import RELEASE_NOTES, init_builds

    paths = init_builds(folder)
    builds = sum(p.suffix == ".yaml" and p.name != "release.yaml" for p in paths)
    click.echo(f"wrote {builds} build files, release.yaml and {RELEASE_NOTES} to {paths[0].parent}; edit them, then "
               f"run release from {folder} (it reads ./builds) or pass --builds {paths[0].parent}")


@main.command()
@click.argument("size", type=click.Choice(["tiny", "nano"]))
@click.option("--out", "out", type=click.Path(path_type=Path), required=True, help="Folder to create.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the weights and observations.")
@click.option("--calibration", "n_obs", type=click.IntRange(1, 10_000), default=32, show_default=True, metavar="N",
              help="How many observations from the calibration labs.")
@click.option("--heldout", type=click.IntRange(0, 10_000), default=16, show_default=True, metavar="N",
              help="How many observations from the held-out labs.")
def fixture(size: str, out: Path, seed: int, n_obs: int, heldout: int) -> None:
    """A Cosmos3OmniTransformer checkpoint (the real architecture) and synthetic DROID observations.

    tiny: 565k parameters, runs on a CPU, with a reference FP8 checkpoint made by ModelOpt's own Hugging Face export
    (what 'release verify' compares builds of this source with). nano: the 15.7B model's sizes with random weights
    (31 GB; for speed and scale runs, best on a GPU with 80 GB)."""
    from release.inputs.fixture import write_fixture

    paths = write_fixture(out, size=size, seed=seed, n_obs=n_obs, heldout=heldout)
    click.echo(f"source:       {paths['source']} (revision {paths['revision'][:12]})")
    click.echo(f"observations: {paths['observations']}")
    if "reference" in paths:
        click.echo(f"reference:    {paths['reference']} (ModelOpt's own FP8 export of the source)")


@main.command()
@BUILDS
@click.argument("names", nargs=-1)
@click.option("--all", "all_builds", is_flag=True, help="Build the sweep of release.yaml (else every build file).")
@SOURCE
@OBSERVATIONS
@click.option("--dist", "--out", "out", type=click.Path(path_type=Path), default=Path("dist"), show_default=True,
              help="The release's folder, a folder per build repo inside it (--out: the same, its older name).")
@ALLOW_REVISION_MISMATCH
@max_gpu_memory_option
@EXECUTOR
def build(names: tuple[str, ...], all_builds: bool, source: str | None, observations: Path | None,
          out: Path, allow_revision_mismatch: bool, max_gpu_memory: str | None, executor: str) -> None:
    """Quantize, export and record provenance for the named builds."""
    from release.core.memory import set_cap
    from release.pipeline.spread import build_as_jobs
    from release.pipeline.sweep import run_builds
    from release.quantize.build import BuildRequest

    set_cap(max_gpu_memory)
    request = BuildRequest.create(names, all_builds, source, observations, out, allow_revision_mismatch)
    if not (run_builds(request) if executor == "local" else build_as_jobs(request, executor, max_gpu_memory)):
        sys.exit(1)


@main.command()
@BUILDS
@SOURCE
@OBSERVATIONS
@DIST
@click.option("--keep-checkpoints", is_flag=True, help="Keep every build's weights (default: drop each after its "
              "evaluation unless it is sure to be delivered; a chosen one is rebuilt and checked byte for byte).")
@BASELINE
@RESAMPLES
@ALLOW_REVISION_MISMATCH
@max_gpu_memory_option
@EXECUTOR
def campaign(source: str | None, observations: Path | None, dist: Path, keep_checkpoints: bool, baseline: str,
             resamples: int, allow_revision_mismatch: bool, max_gpu_memory: str | None, executor: str) -> None:
    """The whole campaign in one resumable command: build, verify and evaluate the sweep; tables, selection, cards.

    Each build of the sweep is made, verified and evaluated as campaign.evals of release.yaml lists, then the tables,
    the selection and the delivered builds' cards follow (DIST/campaign.json records each step; rerun to resume
    after a stop)."""
    from release.core.memory import set_cap
    from release.pipeline.campaign import CampaignRequest, run_campaign

    set_cap(max_gpu_memory)
    request = CampaignRequest.create(source, observations, dist, keep_checkpoints, baseline, resamples,
                                     allow_revision_mismatch, executor=executor, max_gpu_memory=max_gpu_memory)
    cards, ok = run_campaign(request)
    for path in cards:
        click.echo(f"card: {path}")
    click.echo(f"campaign: {dist} (tables/, selection.json, {len(cards)} card files; {dist / 'campaign.json'})")
    if not ok:
        click.echo("campaign: a build failed its verification (above); it was not evaluated", err=True)
        sys.exit(1)


@main.command()
@BUILDS
@click.argument("names", nargs=-1)
@click.option("--all", "all_builds", is_flag=True, help="Verify every build of the sweep that is in --dist.")
@DIST
@click.option("--reference", default=None, help="Reference checkpoint (NVIDIA's Cosmos3-Nano@fp8): a folder or a "
              "Hub id org/name[@revision] in the local cache; default: the fixture's reference when the source is "
              "a tiny fixture, else the RTN build in --dist (a self-reference).")
@click.option("--source", default=None, help="BF16 source the values are recomputed from (default: as for build).")
@click.option("--observations", type=click.Path(path_type=Path), default=None,
              help="Observations for the loadability rollout (default: beside the source).")
@FORMAT
@max_gpu_memory_option
def verify(names: tuple[str, ...], all_builds: bool, dist: Path, reference: str | None, source: str | None,
           observations: Path | None, fmt: str, max_gpu_memory: str | None) -> None:
    """Check built repos against a reference and their source; exit 1 if any check fails."""
    from release.check.verify import VerifyRequest, verify_builds, verify_names
    from release.core.memory import set_cap

    set_cap(max_gpu_memory)

    requests = [VerifyRequest.create(n, dist, reference, source, observations)
                for n in verify_names(names, all_builds, dist)]
    if not verify_builds(requests, fmt):
        sys.exit(1)


@main.command("eval")
@BUILDS
@click.argument("names", nargs=-1)
@click.option("--all", "all_builds", is_flag=True, help="Evaluate the sweep of builds/release.yaml (as build --all).")
@click.option("--chosen", is_flag=True, help="Evaluate the builds the release delivers (selection.json's choice, with "
              "release.yaml's overrides), as the campaign does after 'release select'.")
@click.option("--path", "path_", type=click.Choice(["fakequant", "deployed", "served"]), default="fakequant",
              show_default=True, help="fakequant: the seed's offline replay; deployed: diffusers with ModelOpt's FP8 "
              "GEMM; served: as NVIDIA's policy server runs it (TorchAO, the 'served' extra).")
@click.option("--split", type=click.Choice(["calibration", "validation", "all"]), default="calibration",
              show_default=True)
@DIST
@click.option("--source", type=click.Path(path_type=Path), default=None,
              help="BF16 source the rollouts compare with (default: $RELEASE_SOURCE, then as for build).")
@click.option("--w8a16-first", type=click.IntRange(0, 100), default=None, metavar="N",
              help="--path served: the first N denoising steps run W8A16 (default: served_steps of release.yaml).")
@click.option("--w8a16-last", type=click.IntRange(0, 100), default=None, metavar="N",
              help="--path served: the last N denoising steps run W8A16 (default: served_steps of release.yaml).")
@OBSERVATIONS
@click.option("--yardsticks", is_flag=True, help="Also BF16 eager vs torch.compile and seed vs seed.")
@click.option("--external", default=None, metavar="CHECKPOINT", help="Also an FP8 checkpoint made elsewhere (a folder "
              "or a Hub id in the local cache, e.g. NVIDIA's published one), as a row beside the builds.")
@click.option("--external-title", default="published NVIDIA FP8", show_default=True,
              help="The row's title in the tables and cards.")
@max_gpu_memory_option
@EXECUTOR
def eval_(names: tuple[str, ...], all_builds: bool, chosen: bool, path_: str, split: str, dist: Path,
          source: Path | None, w8a16_first: int | None, w8a16_last: int | None, observations: Path | None,
          yardsticks: bool, external: str | None, external_title: str, max_gpu_memory: str | None,
          executor: str) -> None:
    """Replay the policy for BF16 and each build on the same seeds; store the action chunks."""
    from release.core.memory import set_cap
    from release.measure.evaluate import EvalRequest, describe, run_eval
    from release.pipeline.spread import eval_as_jobs

    set_cap(max_gpu_memory)

    request = EvalRequest.create(names, path_, split, dist, source, observations, yardsticks, all_builds,
                                 external, external_title, (w8a16_first, w8a16_last), chosen=chosen)
    for out in run_eval(request) if executor == "local" else eval_as_jobs(request, executor, max_gpu_memory):
        click.echo(f"results: {out} ({describe(out)})")


@main.group()
def observations() -> None:
    """Observation sets: import real DROID frames."""


@observations.command("import-lerobot")
@BUILDS
@click.argument("dataset", type=click.Path(path_type=Path, file_okay=False))
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Observation set to write.")
@click.option("--per-lab", type=click.IntRange(1, 100_000), default=8, show_default=True,
              help="Frames drawn from each lab.")
@click.option("--labs", default=None, help="Comma-separated labs (values of --lab-field); default: the "
              "calibration_labs and heldout_labs of release.yaml.")
@click.option("--lab-field", default="building", show_default=True, metavar="NAME",
              help="The per-frame or per-episode column that names the lab (DROID's is 'building').")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the frame draw.")
def import_lerobot_(dataset: Path, out: Path, per_lab: int, labs: str | None, lab_field: str, seed: int) -> None:
    """Sample DROID frames of a local LeRobot dataset (codebase v2.1 or v3.0) into an observation set, with
    action_stats.json from the dataset's statistics."""
    from release.core.builds import load_release
    from release.inputs.lerobot import import_lerobot

    release = load_release()
    chosen = [lab.strip() for lab in labs.split(",") if lab.strip()] if labs else \
        [*release.calibration_labs, *release.heldout_labs]
    written = import_lerobot(dataset, out, chosen, per_lab, seed, lab_field)
    click.echo(f"observations: {written} ({per_lab} frames from each of {len(chosen)} labs)")


@main.command("import-served")
@BUILDS
@click.argument("name")
@click.argument("file", type=click.Path(path_type=Path, dir_okay=False))
@DIST
@click.option("--source", type=click.Path(path_type=Path), default=None,
              help="BF16 source the rollouts compare with (default: $RELEASE_SOURCE, then as for build).")
@OBSERVATIONS
def import_served_(name: str, file: Path, dist: Path, source: Path | None, observations: Path | None) -> None:
    """Take a policy server's results (npz) as the build's 'served' path."""
    from release.measure.evaluate import describe
    from release.measure.imported import import_served

    out = import_served(name, file, dist, observations, source)
    click.echo(f"results: {out} ({describe(out)})")


@main.command()
@BUILDS
@click.argument("names", nargs=-1)
@DIST
@click.option("--out", type=click.Path(path_type=Path), default=None, help="Default: DIST/tables.")
@BASELINE
@RESAMPLES
def tables(names: tuple[str, ...], dist: Path, out: Path | None, baseline: str, resamples: int) -> None:
    """Fidelity, served, ranking and attribution tables (CSV and JSON) across every evaluated build."""
    from release.measure.tables import TablesRequest, run_tables

    request = TablesRequest.create(names, dist, out, baseline, resamples)
    result = run_tables(request)
    click.echo(result["fidelity"].to_string(index=False))
    click.echo(f"tables: {request.out} ({', '.join(f'{name}.csv' for name in result)}, tables.json)")


@main.command("select")
@BUILDS
@DIST
@FORMAT
def select_(dist: Path, fmt: str) -> None:
    """Apply the selection rule of builds/release.yaml to DIST/tables/tables.json; write DIST/selection.json."""
    import json

    from rich.console import Console

    from release.measure.select import SelectRequest, delivery, ranking_table, run_select

    request = SelectRequest.create(dist)
    doc = run_select(request)
    delivered = delivery(request.release, doc).builds
    if fmt == "json":
        click.echo(json.dumps({"selection": str(request.out), "delivered": delivered,
                               "document": doc.model_dump(mode="json")}, indent=2, sort_keys=True))
        return
    Console(width=160).print(ranking_table(doc))
    click.echo(f"selection: {request.out}")
    click.echo(f"delivered: {', '.join(delivered) or 'none'}")


@main.command()
@BUILDS
@click.argument("names", nargs=-1)
@DIST
@click.option("--lang", default=None, help="Comma-separated languages, among the release's 'languages'; the first "
              "is README.md.  [default: the release's 'languages']")
@click.option("--check", is_flag=True, help="Render without writing; fail on a missing translation or bad data.")
@click.option("--preview", type=click.Path(path_type=Path, file_okay=False), default=None, metavar="DIR",
              help="Also write the pull-request preview of the cards: DIR/comment.md (each changed card's diff "
              "against --base's, inline and collapsed, under GitHub's limit), DIR/cards.diff and DIR/cards/REPO/.")
@click.option("--base", type=click.Path(path_type=Path, file_okay=False), default=None, metavar="DIST",
              help="With --preview: the dist whose rendered cards to compare with (the base commit's).")
@click.option("--note", default="", help="With --preview: a paragraph for the comment (what the cards are made from).")
def card(names: tuple[str, ...], dist: Path, lang: str | None, check: bool, preview: Path | None, base: Path | None,
         note: str) -> None:
    """Render the model cards (README.md, README.<lang>.md, LICENSE, forest plot) of each built repo."""
    from release.publish.card.render import CardRequest, render_cards
    from release.publish.preview import CardPreviewRequest, write_card_preview

    previewed = CardPreviewRequest.create(dist, preview, base, note, check)
    request = CardRequest.create(names, dist, lang, check)
    for path in render_cards(request):
        click.echo(f"{'checked' if check else 'card'}: {path}")
    if previewed is not None:
        changes = write_card_preview(previewed)
        click.echo(f"preview: {previewed.out} ({len(changes)} card files differ from --base's)")


@main.command()
@BUILDS
@click.argument("names", nargs=-1)
@click.option("--org", default=None, help="Hub organisation (default: builds/release.yaml).")
@DIST
@click.option("--endpoint", default=None, help="Hub endpoint (default: huggingface_hub's, HF_ENDPOINT).")
@click.option("--dry-run", is_flag=True, help="Print the plan (text: Markdown) and its totals; change nothing.")
@click.option("--create-pr", is_flag=True, help="Open a Hub pull request instead of committing to main.")
@FORMAT
@click.option("--force", default=None, metavar="REASON", help="Push builds whose verification failed, was skipped "
              "in part, or is missing; REASON goes into the commit message.")
@click.option("--retag", is_flag=True, help="Move the release tag v<version> to the new commit if it points elsewhere "
              "(without it, such a push is refused before anything is committed).")
@click.option("--target", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Publish to this local folder (ORG/REPO inside it) instead of the Hub.")
@click.option("--private", is_flag=True, help="Create new repos private (an existing public repo is refused, never "
              "flipped).")
@click.option("--commit-message", default=None, metavar="LINE", help="The summary line of each commit (default: "
              "'Release <version>: <build> ...'); the description is the release notes.")
@click.option("--revision", default="main", show_default=True, metavar="BRANCH",
              help="Push to this branch, created from main's head if missing (tags are made on main only).")
@click.option("--from-manifest", "manifest", type=click.Path(path_type=Path, dir_okay=False), default=None,
              metavar="FILE", help="With --dry-run: plan the release manifest FILE (release.lock.json) without the "
              "weights, its cards rendered from its sidecars (instead of --dist).")
@click.option("--preview", type=click.Path(path_type=Path, file_okay=False), default=None, metavar="DIR",
              help="With --dry-run: also write DIR/comment.md (the pull-request comment, under GitHub's limit), the "
              "full plan (plan.md, plan.json) and the cards of each repo (cards/REPO/).")
@click.option("--collection/--no-collection", default=True, show_default=True,
              help="Create or update the Hub collection of the delivered repos ('collection' in release.yaml).")
def push(names: tuple[str, ...], org: str | None, dist: Path, endpoint: str | None, dry_run: bool,
         create_pr: bool, fmt: str, force: str | None, retag: bool, target: Path | None, private: bool,
         commit_message: str | None, revision: str, manifest: Path | None, preview: Path | None,
         collection: bool) -> None:
    """Plan and publish the sibling repos (token from HF_TOKEN or the huggingface_hub login; never printed): what
    goes where and the progress on stderr, then what was done, with each commit, and the totals."""
    from release.publish.push import PushRequest, run_push

    click.echo(run_push(PushRequest.create(names, org, dist, dry_run, endpoint, create_pr, fmt, force, target,
                                           retag, private, commit_message, revision, manifest, preview,
                                           collection)))


@main.command()
@BUILDS
@click.argument("names", nargs=-1)
@DIST
@click.option("--out", type=click.Path(path_type=Path, dir_okay=False), default=Path("release.lock.json"),
              show_default=True, help="The manifest to write (commit it: the pull-request preview plans it).")
def manifest(names: tuple[str, ...], dist: Path, out: Path) -> None:
    """Write the release manifest of every file of each sibling repo, for a dry run without the weights.

    Each file's sha256, size and storage, and the sidecars the cards are made from: what 'release push --dry-run
    --from-manifest' plans."""
    from release.publish.manifest import ManifestRequest, run_manifest

    lock = run_manifest(ManifestRequest.create(names, dist, out))
    files = sum(len(s.files) for s in lock.siblings)
    click.echo(f"manifest: {out} (release {lock.version}: {len(lock.siblings)} repos, {files} files, "
               f"{len(lock.sidecars)} sidecars)")
