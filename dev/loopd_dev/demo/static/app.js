// The demo's chat page: one channel of the fake Mattermost, as its web app would show it.
// It reads and writes through the fake's own REST API and WebSocket as one person (the
// configuration in the page says who), so loopd sees exactly what a real client would send.
// Text from the server (the model's answers included) is only ever set as text, never as HTML.
"use strict";

const config = JSON.parse(document.getElementById("demo-config").textContent);
const API = "/api/v4";
const TYPING_SHOWN_MS = 6000;

const state = {
  posts: new Map(), // id -> post, as the server sent it last
  edits: new Map(), // id -> how many edits this page has seen (loopd's answer grows by edits)
  selected: null, // the root post id of the thread shown, or null for a new thread
  typingUntil: new Map(), // root id ("" for the channel) -> time the indicator expires
  sending: false, // a post is on its way
  pendingId: null, // the message's pending_post_id: a post sent again is taken for the first
  socket: null,
};

const el = (id) => document.getElementById(id);
const glyphs = new Map(config.reactions.map((r) => [r.emoji, r.glyph]));

function notice(text) {
  const box = el("notice");
  box.textContent = text || "";
  box.hidden = !text;
}

async function call(method, path, body) {
  const response = await fetch(API + path, {
    method,
    headers: {
      Authorization: `Bearer ${config.person.token}`,
      "Content-Type": "application/json",
    },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  if (!response.ok) {
    let message = text;
    try {
      message = JSON.parse(text).message || text;
    } catch (_) {
      // a body that is not JSON is shown as it came
    }
    throw new Error(`${response.status} ${message}`.slice(0, 300));
  }
  return text ? JSON.parse(text) : null;
}

// ----- the posts this page knows -----

function keep(post) {
  if (post.channel_id !== config.channel.id) return false;
  if (post.delete_at) {
    state.posts.delete(post.id);
    return true;
  }
  const known = state.posts.get(post.id);
  if (known && post.update_at < known.update_at) return false; // an older copy
  state.posts.set(post.id, post);
  return true;
}

function keepList(list) {
  for (const id of list.order || []) {
    const post = list.posts[id];
    if (post) keep(post);
  }
}

function rootOf(post) {
  return post.root_id || post.id;
}

function reactionsOf(post) {
  return (post.metadata && post.metadata.reactions) || [];
}

function setReaction(reaction, added) {
  const post = state.posts.get(reaction.post_id);
  if (!post) return false;
  const others = reactionsOf(post).filter(
    (r) => !(r.user_id === reaction.user_id && r.emoji_name === reaction.emoji_name),
  );
  post.metadata = { ...(post.metadata || {}), reactions: added ? [...others, reaction] : others };
  return true;
}

function kindOf(post) {
  const key = (post.props && post.props.loopd_turn) || "";
  if (post.user_id !== config.bot.id) return "person";
  return key.endsWith(":status") ? "status" : "answer";
}

// ----- drawing -----

function readable(text) {
  // loopd writes Mattermost's emoji names (":octagonal_sign:"); show the ones the page knows.
  return text.replace(/:([a-z0-9_+-]+):/g, (whole, name) => glyphs.get(name) || whole);
}

function drawThreadList() {
  const roots = [...state.posts.values()]
    .filter((p) => !p.root_id)
    .sort((a, b) => b.create_at - a.create_at);
  const replies = new Map();
  for (const post of state.posts.values()) {
    if (post.root_id) replies.set(post.root_id, (replies.get(post.root_id) || 0) + 1);
  }
  const list = el("thread-list");
  list.replaceChildren(
    ...roots.map((root) => {
      const item = document.createElement("li");
      item.dataset.rootId = root.id;
      item.classList.toggle("selected", root.id === state.selected);
      const first = root.message.replace(`@${config.bot.username}`, "").trim().split("\n")[0];
      const label = document.createElement("span");
      label.className = "label";
      label.textContent = first || "(no text)";
      const count = document.createElement("span");
      count.className = "replies";
      count.textContent = `${replies.get(root.id) || 0}`;
      count.title = "replies";
      item.append(label, count);
      item.title = root.message;
      item.addEventListener("click", () => select(root.id));
      return item;
    }),
  );
}

function drawReactions(post) {
  const box = document.createElement("div");
  box.className = "reactions";
  const byEmoji = new Map();
  for (const r of reactionsOf(post)) {
    if (!byEmoji.has(r.emoji_name)) byEmoji.set(r.emoji_name, []);
    byEmoji.get(r.emoji_name).push(config.users[r.user_id] || r.user_id);
  }
  for (const [emoji, who] of byEmoji) {
    const chip = document.createElement("button");
    chip.type = "button";
    chip.className = "reaction";
    chip.dataset.emoji = emoji;
    chip.classList.toggle("mine", who.includes(config.person.username));
    chip.textContent = `${glyphs.get(emoji) || `:${emoji}:`} ${who.join(", ")}`;
    chip.addEventListener("click", () => toggleReaction(post.id, emoji));
    box.append(chip);
  }
  return box;
}

function drawActions(post) {
  const box = document.createElement("div");
  box.className = "actions";
  for (const r of config.reactions) {
    const button = document.createElement("button");
    button.type = "button";
    button.dataset.emoji = r.emoji;
    button.title = `${r.meaning} (:${r.emoji}:)`;
    button.textContent = r.glyph;
    button.addEventListener("click", () => toggleReaction(post.id, r.emoji));
    box.append(button);
  }
  return box;
}

function drawPost(post) {
  const kind = kindOf(post);
  const article = document.createElement("article");
  article.className = `post ${kind === "person" ? "person" : "bot"}`;
  article.dataset.postId = post.id;
  article.dataset.author = config.users[post.user_id] || post.user_id;
  article.dataset.kind = kind;
  article.dataset.edits = String(state.edits.get(post.id) || 0);

  const header = document.createElement("header");
  const author = document.createElement("span");
  author.className = "author";
  author.textContent = article.dataset.author;
  const time = document.createElement("time");
  time.dateTime = new Date(post.create_at).toISOString();
  time.textContent = new Date(post.create_at).toLocaleTimeString([], { hour12: false });
  header.append(author, time);
  if (post.edit_at) {
    const edited = document.createElement("span");
    edited.className = "edited";
    edited.textContent = "(edited)";
    header.append(edited);
  }
  const message = document.createElement("div");
  message.className = "message";
  message.textContent = readable(post.message);
  article.append(header, message, drawReactions(post));
  if (kind !== "person") article.append(drawActions(post));
  return article;
}

function welcome() {
  const text = document.createElement("div");
  text.className = "welcome";
  const lines = [
    `You are @${config.person.username} in ~${config.channel.name}. Write below to start a ` +
      `thread: mention @${config.bot.username} and it answers; it answers every later reply ` +
      "in the thread.",
    "Its answer grows as the model writes it. Under each of its posts:",
    ...config.reactions.map((r) => `${r.glyph}  ${r.meaning}`),
  ];
  for (const line of lines) {
    const p = document.createElement("p");
    p.textContent = line;
    text.append(p);
  }
  return text;
}

function drawThread() {
  const box = el("posts");
  const atBottom = box.scrollHeight - box.scrollTop - box.clientHeight < 40;
  if (state.selected === null) {
    box.replaceChildren(welcome());
  } else {
    const posts = [...state.posts.values()]
      .filter((p) => rootOf(p) === state.selected)
      .sort((a, b) => a.create_at - b.create_at);
    box.replaceChildren(...posts.map(drawPost));
  }
  if (atBottom) box.scrollTop = box.scrollHeight;
  drawTyping();
}

function drawTyping() {
  const until = state.typingUntil.get(state.selected || "") || 0;
  const shown = until > Date.now();
  el("typing").hidden = !shown;
  el("typing").textContent = shown ? `${config.bot.username} is typing…` : "";
}

function draw() {
  drawThreadList();
  drawThread();
}

// ----- acting as the person -----

async function select(rootId) {
  state.selected = rootId;
  state.pendingId = null; // a message for another thread
  history.replaceState(null, "", rootId ? `#${rootId}` : "#");
  el("message").placeholder = rootId
    ? "Reply in this thread… (Enter sends, Shift+Enter for a new line)"
    : `Start a thread: @${config.bot.username} … (Enter sends)`;
  if (!rootId && !el("message").value) el("message").value = `@${config.bot.username} `;
  draw();
  if (rootId) {
    try {
      keepList(await call("GET", `/posts/${rootId}/thread`));
      draw();
    } catch (error) {
      notice(`could not read the thread: ${error.message}`);
    }
  }
}

async function send(event) {
  event.preventDefault();
  const box = el("message");
  const message = box.value;
  if (!message.trim()) return;
  if (state.sending) return; // Enter pressed again before the server answered: one post
  // As Mattermost's web app does: one id per message typed, so that sending it again after a
  // failure the server may have committed anyway (a timeout, a 5xx) posts it once.
  if (!state.pendingId) state.pendingId = `${config.person.id}:${Date.now()}`;
  const body = { channel_id: config.channel.id, message, pending_post_id: state.pendingId };
  if (state.selected) body.root_id = state.selected;
  state.sending = true;
  el("send").disabled = true;
  try {
    const post = await call("POST", "/posts", body);
    state.pendingId = null;
    box.value = "";
    notice("");
    keep(post);
    if (!state.selected) await select(post.id);
    else draw();
  } catch (error) {
    // The text stays in the box: nothing typed is lost.
    notice(`could not send: ${error.message}`);
  } finally {
    state.sending = false;
    el("send").disabled = false;
  }
}

async function toggleReaction(postId, emoji) {
  const post = state.posts.get(postId);
  const mine =
    post && reactionsOf(post).some((r) => r.user_id === config.person.id && r.emoji_name === emoji);
  try {
    if (mine) {
      await call("DELETE", `/users/${config.person.id}/posts/${postId}/reactions/${emoji}`);
    } else {
      await call("POST", "/reactions", {
        user_id: config.person.id,
        post_id: postId,
        emoji_name: emoji,
      });
    }
    notice("");
  } catch (error) {
    notice(`could not react: ${error.message}`);
  }
}

// ----- the server's events -----

function onEvent(frame) {
  const data = frame.data || {};
  switch (frame.event) {
    case "hello":
      el("connection").dataset.connected = "true";
      el("connection").textContent = "connected";
      catchUp();
      return;
    case "posted":
    case "post_edited":
    case "post_deleted": {
      const post = JSON.parse(data.post);
      if (frame.event === "post_edited") state.edits.set(post.id, (state.edits.get(post.id) || 0) + 1);
      if (frame.event === "post_deleted") post.delete_at = post.delete_at || Date.now();
      if (frame.event === "posted" && post.user_id === config.bot.id) {
        state.typingUntil.delete(rootOf(post));
      }
      if (keep(post)) draw();
      return;
    }
    case "reaction_added":
    case "reaction_removed":
      if (setReaction(JSON.parse(data.reaction), frame.event === "reaction_added")) draw();
      return;
    case "typing":
      if (frame.broadcast && frame.broadcast.channel_id === config.channel.id) {
        state.typingUntil.set(data.parent_id || "", Date.now() + TYPING_SHOWN_MS);
        drawTyping();
        setTimeout(drawTyping, TYPING_SHOWN_MS + 50);
      }
      return;
    default:
  }
}

async function catchUp() {
  try {
    keepList(await call("GET", `/channels/${config.channel.id}/posts?per_page=200`));
    if (state.selected) keepList(await call("GET", `/posts/${state.selected}/thread`));
    draw();
  } catch (error) {
    notice(`could not read the channel: ${error.message}`);
  }
}

function connect() {
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const socket = new WebSocket(`${scheme}://${location.host}${API}/websocket`);
  state.socket = socket;
  socket.addEventListener("open", () => {
    // A browser cannot set the Authorization header on a WebSocket: the web app's challenge.
    socket.send(
      JSON.stringify({
        seq: 1,
        action: "authentication_challenge",
        data: { token: config.person.token },
      }),
    );
  });
  socket.addEventListener("message", (message) => {
    let frame;
    try {
      frame = JSON.parse(message.data);
    } catch (_) {
      return; // not an event
    }
    if (frame.event) onEvent(frame);
  });
  socket.addEventListener("close", () => {
    el("connection").dataset.connected = "false";
    el("connection").textContent = "reconnecting…";
    setTimeout(connect, 1000);
  });
}

function start() {
  el("where").textContent = `~${config.channel.name} as @${config.person.username}`;
  if (config.status_url) {
    el("status-link").href = config.status_url;
    el("status-link").hidden = false;
  }
  el("composer").addEventListener("submit", send);
  el("message").addEventListener("input", () => {
    state.pendingId = null; // another text is another message
  });
  el("message").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) send(event);
  });
  el("new-thread").addEventListener("click", () => select(null));
  const fromHash = location.hash.slice(1);
  select(fromHash || null);
  connect();
}

start();
