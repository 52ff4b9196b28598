// The demo page when the server fails a post: nothing typed is lost (the text stays in the box,
// one line says why), and sending it again posts it once (the same pending_post_id, as
// Mattermost's web app sends, so the server takes the second for the first).
// Input: one JSON argument (modules, chromium, profile, url, wait_ms). Output: one JSON object.
'use strict';

const input = JSON.parse(process.argv[2]);
const {chromium} = require(`${input.modules}/playwright-core`);

const FLAGS = [
    '--headless',
    '--no-sandbox',
    '--disable-gpu',
    '--disable-background-networking',
    '--disable-component-update',
    '--disable-sync',
    '--no-first-run',
];
const wait = {timeout: input.wait_ms};

async function main() {
    const context = await chromium.launchPersistentContext(input.profile, {
        executablePath: input.chromium,
        headless: true,
        args: FLAGS,
    });
    const out = {};
    try {
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
    } finally {
        await context.close();
    }
    return out;
}

main().then(
    (out) => process.stdout.write(JSON.stringify(out)),
    (err) => {
        process.stderr.write(`${err.stack || err}\n`);
        process.exit(1);
    },
);
