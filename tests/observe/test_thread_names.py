"""Thread names on the status page: a Mattermost session is shown by its channel, the person who
started it and its first words, linked to the thread; all of it bounded and escaped, and a link
only to Mattermost's own address and a Mattermost id."""

from __future__ import annotations

from loopcommon.statuspage import SessionView, StatusSnapshot, ThreadView, render
from loopd.chat.labels import first_words, thread_label
from loopd.chat.model import Channel, User

ROOT = "q" * 26


def page(thread: ThreadView, thread_url: str | None = "https://chat.example.com") -> str:
    view = SessionView("mm:" + thread.root, 0, 1, None, None, (), None, thread)
    return render(StatusSnapshot("2026-05-01T12:00:00Z", "m", (), (), (view,)), thread_url)


def test_a_thread_is_named_by_its_channel_person_and_first_words() -> None:
    label = thread_label(
        ROOT, Channel("c1", "O", "town-square"), User("u1", "alice"), "  @loopd:\n why is\tCI red?"
    )
    assert label == ThreadView(ROOT, "~town-square", "alice", "@loopd: why is CI red?")
    html = page(label)
    assert (
        f'<a href="https://chat.example.com/_redirect/pl/{ROOT}" rel="noreferrer">'
        "<bdi>~town-square</bdi></a> · @<bdi>alice</bdi> · “<bdi>@loopd: why is CI red?</bdi>”"
    ) in html
    assert f"<code><bdi>mm:{ROOT}</bdi></code>" in html  # loopd's own name stays beside it


def test_hidden_characters_show_and_each_label_keeps_to_itself() -> None:
    # An override in the first words would read the rest of the row backwards; a zero-width
    # space and a control would hide in the person's name.
    tricky = ThreadView(ROOT, "~dev\u200b", "al\u200bice\x07", "report\u202efdp.sh and more")
    html = page(tricky)
    assert "@<bdi>al&lt;U+200B&gt;ice␇</bdi>" in html
    assert "“<bdi>report&lt;U+202E&gt;fdp.sh and more</bdi>”" in html
    assert "<bdi>~dev&lt;U+200B&gt;</bdi>" in html
    assert not any(char in html for char in "\u200b\u202e\x07")


def test_direct_and_group_messages_name_no_channel() -> None:
    direct = thread_label(ROOT, Channel("c", "D", "u1__u2"), User("u1", "bob"), "hi")
    group = thread_label(ROOT, Channel("c", "G", "abc123"), User("u1", "bob"), "hi")
    assert (direct.channel, group.channel) == ("direct message", "group message")


def test_first_words_are_cut_at_a_word() -> None:
    assert first_words("one two three four", limit=9) == "one two…"
    assert first_words("x" * 100, limit=10) == "x" * 10 + "…"


def test_what_a_thread_holds_is_text_and_no_link_goes_elsewhere() -> None:
    hostile = ThreadView(
        '"><script>x</script>', '~a"><img src=x onerror=alert(1)>', "<b>eve</b>", "</td>" * 100
    )
    html = page(hostile)
    assert "<script>" not in html
    assert "<img" not in html
    assert "<b>eve" not in html
    assert "_redirect" not in html  # the root is not a Mattermost id: no link is made
    assert html.count("&lt;/td&gt;") <= 24  # the first words are bounded (120 characters)
    for base in ("javascript:alert(1)", 'https://x"onmouseover="a', None):
        assert "<a href" not in page(ThreadView(ROOT, "~dev", "al", "hi"), base)
