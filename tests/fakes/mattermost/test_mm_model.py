"""The fake's pure model: since semantics, paging, history rows, dedup TTL, edit limit."""

import pytest

from loopd_dev.fakes.mattermost.clock import ManualClock
from loopd_dev.fakes.mattermost.errors import AppError
from loopd_dev.fakes.mattermost.model import SINCE_CAP, Patch, World, is_valid_id, seeded_world


@pytest.fixture
def world() -> World:
    return seeded_world(ManualClock(), bot_username="loopd", bot_token="t")


def test_ids_are_26_chars_and_times_strictly_increase(world: World) -> None:
    alice, dev = world.user_by_name("alice"), world.channel_by_name("dev")
    first = world.create_post(alice, dev.id, "a").post
    second = world.create_post(alice, dev.id, "b").post
    assert is_valid_id(first.id)
    assert second.create_at > first.create_at


def test_reply_to_a_reply_is_400_and_root_update_at_bumps(world: World) -> None:
    alice, dev = world.user_by_name("alice"), world.channel_by_name("dev")
    root = world.create_post(alice, dev.id, "root").post
    reply = world.create_post(alice, dev.id, "reply", root_id=root.id).post
    assert root.update_at == reply.create_at
    with pytest.raises(AppError) as caught:
        world.create_post(alice, dev.id, "nested", root_id=reply.id)
    assert caught.value.status_code == 400
    assert caught.value.error_id == "api.post.create_post.root_id.app_error"


def test_rune_limit_counts_code_points(world: World) -> None:
    bot, dev = world.user_by_name("loopd"), world.channel_by_name("dev")
    world.create_post(bot, dev.id, "é" * 16383)  # 32766 bytes, 16383 runes: fine
    with pytest.raises(AppError) as caught:
        world.create_post(bot, dev.id, "é" * 16384)
    assert caught.value.error_id == "model.post.is_valid.message_length.app_error"


def test_dedup_returns_the_same_post_until_the_ttl_passes(world: World) -> None:
    clock = world.clock
    assert isinstance(clock, ManualClock)
    bot, dev = world.user_by_name("loopd"), world.channel_by_name("dev")
    first = world.create_post(bot, dev.id, "hi", pending_post_id="p1")
    world.finish_create(first.post)
    clock.advance(29.9)
    again = world.create_post(bot, dev.id, "hi", pending_post_id="p1")
    assert (again.created, again.post.id) == (False, first.post.id)
    clock.advance(0.2)
    later = world.create_post(bot, dev.id, "hi", pending_post_id="p1")
    assert later.created
    assert later.post.id != first.post.id


def test_a_duplicate_of_a_create_still_in_flight_is_500_pending(world: World) -> None:
    bot, dev = world.user_by_name("loopd"), world.channel_by_name("dev")
    first = world.create_post(bot, dev.id, "hi", pending_post_id="p2")
    with pytest.raises(AppError) as raised:
        world.create_post(bot, dev.id, "hi", pending_post_id="p2")
    assert (raised.value.status_code, raised.value.error_id) == (
        500,
        "api.post.deduplicate_create_post.pending",
    )
    world.finish_create(first.post)
    again = world.create_post(bot, dev.id, "hi", pending_post_id="p2")
    assert (again.created, again.post.id) == (False, first.post.id)


def test_patch_writes_a_history_row_and_keeps_omitted_fields(world: World) -> None:
    bot, dev = world.user_by_name("loopd"), world.channel_by_name("dev")
    post = world.create_post(bot, dev.id, "v1", props={"loopd_turn": "t1"}).post
    world.patch_post(bot, post.id, Patch(message="v2"))
    history = [p for p in world.posts.values() if p.original_id == post.id]
    assert len(history) == 1
    assert history[0].message == "v1"
    assert history[0].delete_at == post.update_at
    assert post.edit_at > 0
    assert post.props == {"loopd_turn": "t1", "from_bot": "true"}


def test_patch_props_replace_the_map(world: World) -> None:
    alice, dev = world.user_by_name("alice"), world.channel_by_name("dev")
    post = world.create_post(alice, dev.id, "x", props={"a": "1"}).post
    world.patch_post(alice, post.id, Patch(props={"b": "2"}))
    assert post.props == {"b": "2"}
    assert post.edit_at == 0  # the message did not change


def test_edit_time_limit_blocks_late_message_edits(world: World) -> None:
    clock = world.clock
    assert isinstance(clock, ManualClock)
    bot, dev = world.user_by_name("loopd"), world.channel_by_name("dev")
    post = world.create_post(bot, dev.id, "v1").post
    world.edit_time_limit_s = 10
    clock.advance(5)
    world.patch_post(bot, post.id, Patch(message="v2"))
    clock.advance(6)
    with pytest.raises(AppError) as caught:
        world.patch_post(bot, post.id, Patch(message="v3"))
    assert caught.value.error_id == "api.post.update_post.permissions_time_limit.app_error"


def test_others_posts_cannot_be_edited(world: World) -> None:
    alice, bot, dev = (
        world.user_by_name("alice"),
        world.user_by_name("loopd"),
        world.channel_by_name("dev"),
    )
    post = world.create_post(alice, dev.id, "mine").post
    with pytest.raises(AppError) as caught:
        world.patch_post(bot, post.id, Patch(message="yours"))
    assert caught.value.status_code == 403


def test_since_returns_edits_deletes_history_rows_and_roots(world: World) -> None:
    clock = world.clock
    assert isinstance(clock, ManualClock)
    alice, dev = world.user_by_name("alice"), world.channel_by_name("dev")
    root = world.create_post(alice, dev.id, "root").post
    old = world.create_post(alice, dev.id, "old").post
    clock.advance(1)
    cursor = clock.now_ms()
    clock.advance(1)
    world.patch_post(alice, old.id, Patch(message="old, edited"))
    doomed = world.create_post(alice, dev.id, "doomed").post
    world.delete_post(alice, doomed.id)
    root_update_before = root.update_at
    reply = world.create_post(alice, dev.id, "reply", root_id=root.id).post
    assert root.update_at > root_update_before

    result = world.posts_since(dev, cursor)
    history = [p for p in result.posts.values() if p.original_id == old.id]
    assert len(history) == 1
    assert history[0].id in result.order
    assert {old.id, doomed.id, reply.id, root.id} <= set(result.order)
    assert result.posts[doomed.id].delete_at > 0
    created = [result.posts[i].create_at for i in result.order]
    assert created == sorted(created, reverse=True)


def test_since_includes_a_root_not_in_order_when_only_the_reply_is_new(world: World) -> None:
    clock = world.clock
    assert isinstance(clock, ManualClock)
    alice, dev = world.user_by_name("alice"), world.channel_by_name("dev")
    root = world.create_post(alice, dev.id, "root").post
    clock.advance(1)
    cursor = clock.now_ms()
    clock.advance(0.01)
    world.update_at_skew_ms = -60_000  # a server clock jump: the root bump lands before the cursor
    reply = world.create_post(alice, dev.id, "reply", root_id=root.id).post
    world.update_at_skew_ms = 0
    reply.update_at = reply.create_at  # only the reply itself counts as new
    result = world.posts_since(dev, cursor)
    assert result.order == [reply.id]
    assert root.id in result.posts


def test_since_is_capped_at_1000(world: World) -> None:
    alice, dev = world.user_by_name("alice"), world.channel_by_name("dev")
    for i in range(SINCE_CAP + 5):
        world.create_post(alice, dev.id, f"m{i}")
    assert len(world.posts_since(dev, 0).order) == SINCE_CAP


def test_paging_after_and_before_walk_the_channel(world: World) -> None:
    alice, dev = world.user_by_name("alice"), world.channel_by_name("dev")
    posts = [world.create_post(alice, dev.id, f"m{i}").post for i in range(10)]
    page0 = world.posts_page(dev, 0, 4)
    assert page0.order == [p.id for p in reversed(posts[6:])]
    assert page0.prev_post_id == posts[5].id
    assert page0.next_post_id == ""
    after = world.posts_around(dev, posts[2].id, before=False, page=0, per_page=3)
    assert after.order == [posts[5].id, posts[4].id, posts[3].id]
    assert after.next_post_id == posts[6].id
    before = world.posts_around(dev, posts[2].id, before=True, page=0, per_page=5)
    assert before.order == [posts[1].id, posts[0].id]


def test_reactions_bump_update_at(world: World) -> None:
    clock = world.clock
    assert isinstance(clock, ManualClock)
    alice, bot, dev = (
        world.user_by_name("alice"),
        world.user_by_name("loopd"),
        world.channel_by_name("dev"),
    )
    post = world.create_post(alice, dev.id, "x").post
    clock.advance(1)
    world.add_reaction(bot, post.id, "eyes")
    assert post.has_reactions
    assert post.update_at > post.create_at
