// The REST calls loopd makes, and the ones a person's client makes, through the official
// Client4 against the fake. Input: one JSON argument; output: one JSON object of what came back.
'use strict';
const {Client4} = require('@mattermost/client');

const input = JSON.parse(process.argv[2]);

function client(token) {
    const c = new Client4();
    c.setUrl(input.url);
    if (token) {
        c.setToken(token);
    }
    return c;
}

async function failure(promise) {
    try {
        await promise;
        return null;
    } catch (err) {
        return {status_code: err.status_code, server_error_id: err.server_error_id};
    }
}

async function main() {
    const bot = client(input.bot_token);
    const out = {};
    out.ping = await bot.ping();
    out.me = await bot.getMe();
    out.user = await bot.getUser(input.alice_id);
    out.profiles = await bot.getProfilesByIds([input.alice_id]);
    out.teams = await bot.getMyTeams();
    out.channel = await bot.getChannel(input.dev_id);
    out.members = await bot.getChannelMembers(input.dev_id);
    out.config = await bot.getClientConfig();
    out.typing = await bot.doFetch(`${bot.getUserRoute(out.me.id)}/typing`, {
        method: 'post',
        body: JSON.stringify({channel_id: input.dev_id, parent_id: ''}),
    });

    const since = Date.now() - 1000;
    const pending = `${out.me.id}:conformance`;
    out.root = await bot.createPost({
        channel_id: input.dev_id,
        message: 'hello from the official client',
        props: {loopd_turn: 'conformance#1'},
        pending_post_id: pending,
    });
    out.again = await bot.createPost({
        channel_id: input.dev_id,
        message: 'hello from the official client',
        pending_post_id: pending,
    });
    out.reply = await bot.createPost({
        channel_id: input.dev_id,
        root_id: out.root.id,
        message: 'a reply',
    });
    out.patched = await bot.patchPost({id: out.reply.id, message: 'an edited reply'});
    out.reaction = await bot.addReaction(out.me.id, out.root.id, 'eyes');
    out.reactions = await bot.getReactionsForPost(out.root.id);
    out.thread = await bot.getPostThread(out.root.id);
    out.since = await bot.getPostsSince(input.dev_id, since);
    out.after = await bot.getPostsAfter(input.dev_id, out.root.id, 0, 60, false);
    out.bad_root = await failure(
        bot.createPost({channel_id: input.dev_id, root_id: out.reply.id, message: 'x'}),
    );
    out.not_member = await failure(bot.createPost({channel_id: input.quiet_id, message: 'x'}));
    out.deleted = await bot.deletePost(out.reply.id);
    out.patch_deleted = await failure(bot.patchPost({id: out.reply.id, message: 'again'}));

    const person = client(null);
    out.login = await person.login('alice', 'alice-password');
    out.login_token = person.getToken();
    out.login_me = await person.getMe();
    out.bad_login = await failure(client(null).login('alice', 'wrong'));
    out.bot_login = await failure(client(null).login(out.me.username, ''));
    return out;
}

main().then(
    (out) => process.stdout.write(JSON.stringify(out)),
    (err) => {
        process.stderr.write(`${err.stack || err}\n${JSON.stringify(err)}\n`);
        process.exit(1);
    },
);
