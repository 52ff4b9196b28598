// The demo page when the server fails a post: nothing typed is lost (the text stays in the box,
// one line says why), and sending it again posts it once (the same pending_post_id, as
// Mattermost's web app sends, so the server takes the second for the first).
// Input: one JSON argument (modules, chromium, profile, url, wait_ms). Output: one JSON object.
'use strict';

const {input, run, wait} = require('./browser.cjs');

run(async (context) => {
    const out = {};
    const page = await context.newPage();
    await page.goto(input.url);
    await page.waitForSelector('#connection[data-connected="true"]', wait);
    // The create commits, then the server answers 503 (as a proxy's timeout would).
    await page.request.post(`${input.url}_fake/faults/fail_next_creates`, {
        data: {count: 1, status: 503},
    });
    await page.fill('#message', '@loopd kept when refused');
    await page.press('#message', 'Enter');
    await page.waitForSelector('#notice:not([hidden])', wait);
    out.notice = await page.textContent('#notice');
    out.kept = await page.inputValue('#message');
    await page.click('#send');
    await page.waitForFunction(() => document.querySelector('#message').value === '', null, wait);
    await page.waitForSelector('#posts article.post', wait);
    out.notice_after = await page.isHidden('#notice');
    out.posts = await page.$$eval(
        '#posts article.post .message', (m) => m.map((e) => e.textContent));
    out.threads = await page.$$eval('#thread-list li', (items) => items.length);
    return out;
});
