// One thing a person does in a thread, through the official Client4, as the person's own client
// would: post (a message or a reply), react to a post, or read the thread. Input: one JSON
// argument; output: one JSON object of what came back.
'use strict';
const {Client4} = require('@mattermost/client');

const input = JSON.parse(process.argv[2]);

async function main() {
    const c = new Client4();
    c.setUrl(input.url);
    c.setToken(input.token);
    if (input.op === 'post') {
        const post = {channel_id: input.channel_id, message: input.message};
        if (input.root_id) {
            post.root_id = input.root_id;
        }
        return {post: await c.createPost(post)};
    }
    if (input.op === 'react') {
        return {reaction: await c.addReaction(input.user_id, input.post_id, input.emoji_name)};
    }
    if (input.op === 'thread') {
        const thread = await c.getPostThread(input.post_id);
        const posts = Object.values(thread.posts).sort((a, b) => a.create_at - b.create_at);
        return {posts};
    }
    throw new Error(`unknown op ${input.op}`);
}

main().then(
    (out) => process.stdout.write(JSON.stringify(out)),
    (err) => {
        process.stderr.write(`${err.stack || err}\n`);
        process.exit(1);
    },
);
