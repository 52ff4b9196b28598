// make demo's chat page in headless Chromium, as a person uses it: a post, the answer as it
// streams, a stop (🛑), a reply answered, and a regenerate (🔁); then a screenshot.
// Input: one JSON argument (modules, chromium, profile, url, screenshot, prompts, reactions,
// grown_chars, wait_ms). Output: one JSON object of what the page showed at each step.
'use strict';

const {input, run, wait} = require('./browser.cjs');

// Every post of the thread shown, as the page draws it.
function shown(page) {
    return page.$$eval('#posts article.post', (posts) => posts.map((p) => ({
        id: p.dataset.postId,
        author: p.dataset.author,
        kind: p.dataset.kind,
        edits: Number(p.dataset.edits),
        text: p.querySelector('.message').textContent,
        reactions: [...p.querySelectorAll('.reactions .reaction')].map((r) => r.textContent),
    })));
}

// Waits until the thread holds an answer post after the first `after` answers, and returns it.
async function answerAfter(page, after, done) {
    const handle = await page.waitForFunction(
        ({after, done}) => {
            const answers = [...document.querySelectorAll('#posts article.post[data-kind="answer"]')];
            const post = answers[after];
            if (!post) return null;
            const text = post.querySelector('.message').textContent;
            // A draft ends with " …" while more is coming.
            if (!text.trim() || (done && text.endsWith('…'))) return null;
            return {id: post.dataset.postId, text};
        },
        {after, done},
        {...wait, polling: 'raf'},
    );
    return handle.jsonValue();
}

async function textOf(page, id) {
    return page.$eval(`article.post[data-post-id="${id}"] .message`, (m) => m.textContent);
}

async function send(page, text) {
    await page.fill('#message', text);
    await page.press('#message', 'Enter');
    await page.waitForFunction(() => document.querySelector('#message').value === '', null, wait);
}

async function react(page, id, emoji) {
    await page.click(`article.post[data-post-id="${id}"] .actions button[data-emoji="${emoji}"]`);
    await page.waitForSelector(
        `article.post[data-post-id="${id}"] .reactions .reaction[data-emoji="${emoji}"].mine`,
        wait,
    );
}

run(async (context) => {
    const out = {};
    const page = await context.newPage();
    await page.goto(input.url);
    await page.waitForSelector('#connection[data-connected="true"]', wait);
    out.welcome = await page.textContent('#posts');

    // A post, and its answer as it streams: the page shows it growing (to a few lines, so
    // the screenshot shows some of it).
    await send(page, input.prompts.long);
    const first = await answerAfter(page, 0, false);
    await page.waitForFunction(
        ({id, least}) => {
            const post = document.querySelector(`article.post[data-post-id="${id}"] .message`);
            return post && post.textContent.length >= least;
        },
        {id: first.id, least: Math.max(first.text.length + 1, input.grown_chars)},
        {...wait, polling: 'raf'},
    );
    out.streamed = [first.text, await textOf(page, first.id)];

    // 🛑 on the answer while it is written; the thread says it stopped.
    await react(page, first.id, input.reactions.stop);
    await page.waitForFunction(
        () => [...document.querySelectorAll('#posts article.post[data-kind="answer"]')]
            .some((p) => /stopped/i.test(p.querySelector('.message').textContent)),
        null,
        {...wait, polling: 'raf'},
    );
    out.after_stop = await shown(page);

    // A reply, answered to its end.
    await send(page, input.prompts.short);
    const before = out.after_stop.filter((p) => p.kind === 'answer').length;
    const reply = await answerAfter(page, before, true);
    out.reply = reply;

    // 🔁 on that answer: the reaction is on the post, and the answer generated again follows.
    await react(page, reply.id, input.reactions.regenerate);
    out.regenerated = await answerAfter(page, before + 1, true);
    // The turn is over once loopd has removed its status post.
    await page.waitForFunction(
        () => !document.querySelector('#posts article.post[data-kind="status"]'),
        null,
        {...wait, polling: 'raf'},
    );
    out.thread = await shown(page);
    out.threads = await page.$$eval('#thread-list li', (items) => items.map((i) => i.textContent));
    await page.screenshot({path: input.screenshot});
    return out;
}, {width: 1280, height: 900});
