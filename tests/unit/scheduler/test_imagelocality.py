"""ImageLocality: nodes that already have the pod's images score higher, scaled by how widely each image spread."""

from __future__ import annotations

from typing import Any

from crane_scheduler.plugins.imagelocality import ImageLocality, normalized_image_name
from crane_scheduler.podinfo import parse_node, parse_pod
from tests.support.scheduler import node, pod, table

MB = 1024 * 1024


def with_images(n: dict[str, Any], *images: tuple[str, int]) -> dict[str, Any]:
    n["status"]["images"] = [{"names": [name], "sizeBytes": size} for name, size in images]
    return n


def scores(nodes: list[dict[str, Any]], image: str) -> dict[str, int]:
    t = table(*nodes)
    p = pod()
    p["spec"]["containers"][0]["image"] = image
    out = ImageLocality().score({}, parse_pod(p), t, t.live_rows())
    return {t.names[int(r)]: int(s) for r, s in zip(t.live_rows(), out, strict=True)}


def test_score_is_size_times_spread_clamped_and_scaled_as_kube() -> None:
    nodes = [with_images(node("has"), ("reg/app:1", 300_000_000)), node("lacks")]
    # 300 MB x (1 of 2 nodes) = 150 MB; 100 * (150e6 - 23 MiB) / (1000 MiB - 23 MiB) = 12 (integer)
    assert scores(nodes, "reg/app:1") == {"has": 12, "lacks": 0}


def test_small_images_score_nothing_and_untagged_names_mean_latest() -> None:
    assert scores([with_images(node("a"), ("reg/tiny:1", 5 * MB))], "reg/tiny:1") == {"a": 0}
    assert normalized_image_name("reg:5000/app") == "reg:5000/app:latest"
    assert normalized_image_name("reg/app:2") == "reg/app:2"
    latest = [with_images(node("a"), ("reg/app:latest", 2000 * MB))]
    assert scores(latest, "reg/app") == {"a": 100}


def test_image_changes_on_a_node_are_seen() -> None:
    t = table(node("a"), node("b"))
    plugin = ImageLocality()
    p = pod()
    p["spec"]["containers"][0]["image"] = "reg/app:1"
    info = parse_pod(p)
    assert list(plugin.score({}, info, t, t.live_rows())) == [0, 0]
    t.upsert_node(parse_node(with_images(node("b"), ("reg/app:1", 2000 * MB))))
    assert list(plugin.score({}, info, t, t.live_rows())) == [0, 100]  # 2000 MiB x 1/2 reaches the 1000 MiB cap


def test_image_volumes_count_as_images_as_kube_137() -> None:
    # the container's image is nowhere; the image volume's is on "has": 2000 MiB x 1/2 = 1000 MiB of the two
    # images' 2000 MiB cap -> 100 x (1000 - 23) / (2000 - 23) = 49 (1.35 ignored image volumes: 0)
    t = table(with_images(node("has"), ("reg/model:7", 2000 * MB)), node("lacks"))
    p = pod(spec={"volumes": [{"name": "model", "image": {"reference": "reg/model:7"}}]})
    p["spec"]["containers"][0]["image"] = "reg/app:1"
    out = ImageLocality().score({}, parse_pod(p), t, t.live_rows())
    assert out.tolist() == [49, 0]
