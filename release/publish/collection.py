"""The release's Hub collection: the delivered repos, in the order the push takes them (the selection's), each with
its card's title as its note, under the title and description of ``collection`` in ``builds/release.yaml``. Planned
read-only beside the repos (the dry run shows it) and brought up to date after they are pushed: created when the org
has no collection of that title, items added, notes, order and description corrected; nothing written when it is
as planned."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from release.core.errors import ReleaseError
from release.publish.hub_client import describe
from release.publish.plan import RepoPlan, plural
from release.publish.remotes import MAIN, HubRemote
from release.publish.request import PushRequest

NOTE_LIMIT = 500  # the Hub's limit on an item's note


@dataclass
class CollectionPlan:
    title: str
    description: str | None
    org: str
    slug: str | None  # None: the push creates it
    items: list[tuple[str, str]]  # (repo id, note), in order
    changes: list[str] = field(default_factory=list)  # what the push changes, in words
    _remote: Any = field(default=None, repr=False)  # the collection as read (huggingface_hub's Collection)

    @property
    def status(self) -> str:
        return "create" if self.slug is None else "update" if self.changes else "unchanged"


def card_title(card: Path) -> str:
    """The first heading of a card (its ``# `` line after the metadata), the item's note; "" for a card without."""
    for line in card.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith("# "):
            return line[2:].strip()[:NOTE_LIMIT]
    return ""


def plan_collection(remote: HubRemote, request: PushRequest, plans: list[RepoPlan],
                    dist: Path) -> CollectionPlan | None:
    """The collection's plan, or None where a push keeps none: no ``collection`` in release.yaml, ``--no-collection``,
    a folder target, or a push to a branch or as pull requests (the release is on main)."""
    config = request.release.collection
    if config is None or not request.collection or request.create_pr or request.revision != MAIN:
        return None
    items = [(p.repo_id, card_title(dist / b.repo / "README.md")) for p, b in zip(plans, request.builds, strict=True)]
    plan = CollectionPlan(config.title, config.description, request.org, None, items)
    with remote.reading(f"the collections of {request.org}"):
        found = next((c for c in remote.api.list_collections(owner=request.org, limit=100)
                      if c.title == config.title), None)
        if found is None:
            plan.changes = [f"create it with {len(items)} items"]
            return plan
        plan._remote = remote.api.get_collection(found.slug)
    plan.slug = plan._remote.slug
    if (plan._remote.description or None) != config.description:
        plan.changes.append("set its description")
    have = {i.item_id: i for i in plan._remote.items if i.item_type == "model"}
    for position, (repo_id, note) in enumerate(items):
        item = have.get(repo_id)
        if item is None:
            plan.changes.append(f"add {repo_id}")
            continue
        if (item.note or "") != note:
            plan.changes.append(f"set the note of {repo_id}")
        if item.position != position:
            plan.changes.append(f"move {repo_id} to position {position + 1}")
    return plan


def render_collection(plan: CollectionPlan | None) -> list[str]:
    """The collection's lines in a plan: what the push will do to it."""
    if plan is None:
        return []
    what = {"create": "to create", "update": "to update", "unchanged": "unchanged"}[plan.status]
    lines = [f"## Collection: {plan.title} ({plan.org}): {what}", ""]
    lines += [f"{i}. `{repo}`: {note}" for i, (repo, note) in enumerate(plan.items, 1)]
    if plan.status == "update":
        lines += ["", "Changes: " + "; ".join(plan.changes) + "."]
    return [*lines, ""]


def apply_collection(remote: HubRemote, plan: CollectionPlan | None) -> str | None:
    """The collection brought to the plan; what was done, in words (None without a collection)."""
    if plan is None:
        return None
    if plan.status == "unchanged":
        return f"collection {plan.title}: unchanged"
    api = remote.api
    try:
        slug = _apply(remote, plan)
    except ReleaseError:
        raise
    except Exception as exc:  # the Hub refused or did not answer: the repos are pushed, the collection is not
        raise ReleaseError(f"collection {plan.title} of {plan.org}: {describe(exc)}; the repos were pushed, the "
                           "collection is not up to date: rerun 'release push' (it changes no repo that is "
                           "pushed) or pass --no-collection") from exc
    verb = "created" if plan.slug is None else "updated"
    return f"collection {plan.title}: {verb} ({plural(len(plan.items), 'repo')}), {api.endpoint}/collections/{slug}"


def _apply(remote: HubRemote, plan: CollectionPlan) -> str:
    """The writes of :func:`apply_collection`; the collection's slug."""
    api = remote.api
    with remote.deadline(f"the collection {plan.title}"):
        if plan.slug is None:
            created = api.create_collection(plan.title, namespace=plan.org, description=plan.description,
                                            exists_ok=True)
            slug, have = created.slug, {}
        else:
            slug, have = plan.slug, {i.item_id: i for i in plan._remote.items if i.item_type == "model"}
            if (plan._remote.description or None) != plan.description:
                api.update_collection_metadata(slug, description=plan.description)
        for repo_id, note in plan.items:
            item = have.get(repo_id)
            if item is None:
                api.add_collection_item(slug, repo_id, "model", note=note or None, exists_ok=True)
            elif (item.note or "") != note:
                api.update_collection_item(slug, item.item_object_id, note=note)
        for position, (repo_id, _) in enumerate(plan.items):  # each move shifts the items after it: read again
            now = {i.item_id: i for i in api.get_collection(slug).items if i.item_type == "model"}
            if now[repo_id].position != position:
                api.update_collection_item(slug, now[repo_id].item_object_id, position=position)
    return str(slug)
