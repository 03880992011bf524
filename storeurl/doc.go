// Package storeurl opens coordination stores by URL. Driver packages
// register their URL schemes with it when they are imported, as the Go
// CDK's drivers register with a URLMux, so a program links exactly the
// backends it imports:
//
//	import (
//		"github.com/spate-go/spate/storeurl"
//		_ "github.com/spate-go/spate/stores/etcd"
//		_ "github.com/spate-go/spate/stores/redis"
//	)
//
//	st, err := storeurl.OpenStore(ctx, os.Getenv("STORE_URL"), "orders", 15*time.Second, storeurl.Options{})
//
// A URL names a deployment (an etcd cluster, a Redis primary, NATS
// servers); jobs are namespaces within it. [Open] returns a [Deployment]:
// it opens a store per job ([Deployment.Open]) and keeps the namespace
// operations whose key layout only the driver knows: list the jobs, tell
// whether one exists, delete one, read the lease a job was started with.
// [OpenStore] is Open and Deployment.Open in one call; closing the store
// closes the deployment.
//
// # URLs
//
//	scheme://[user[:password]@]host:port[,host:port...][/path][?name=value&...]
//
// A comma-separated list of full URLs of one scheme
// (nats://a:4222,nats://b:4222) is read as the same host list; the servers
// of one URL share one set of credentials. Reserved characters in a user
// name or password (@ : / , ? #) are percent-escaped.
//
// The drivers of this module register:
//
//   - mem:// (stores/mem): an in-process deployment, new on every Open, that
//     lives as long as the Deployment (tests, trials, one process).
//   - etcd://host:port[,host:port...] and etcds:// (TLS) (stores/etcd): job
//     J's keys live under /spate/J/ (?prefix=/other/ moves the root). TLS is
//     also on when Options.TLS or a TLS file parameter is given.
//   - redis://host:port[/db] and rediss:// (TLS) (stores/redis): one
//     server, keys spate:{J}:*; go-redis's own URL parameters
//     (protocol, client_name, pool_size, ...) pass through.
//   - nats://host:port[,...] and tls:// (TLS) (stores/nats): JetStream KV,
//     one bucket pair per job; ?replicas=1|3|5 (default 1), ?creds=FILE (a
//     NATS credentials file). A user name without a password is a token,
//     as nats.go reads it.
//
// Every scheme takes these parameters, which this package consumes before
// the driver sees the URL:
//
//   - ca_file, cert_file, key_file: PEM files of the client's TLS
//     configuration (a CA that verifies the server; a client certificate and
//     its key, which go together).
//   - password_file, token_file: the password or token, read from a file
//     (one trailing newline is trimmed), so that the secret is in neither
//     the URL nor the command line.
//
// A driver refuses a parameter it does not know, naming the ones it takes.
//
// # Secrets
//
// A password comes from [Options.Password] if that resolves to a value,
// else from password_file, else from the URL's user info; a token (only
// NATS uses one; the other drivers ignore it) from [Options.Token], else
// token_file. A [Secret] names a value, a file or an
// environment variable, tried in that order. The command spate fills
// Options.Password from --password, --password-file or $SPATE_STORE_PASSWORD
// and Options.Token from --token, --token-file or $SPATE_STORE_TOKEN.
//
// # Redaction
//
// Nothing this package returns holds a secret. [Deployment] descriptions
// ([Info.Description]) carry no credentials at all; errors show the URL
// through [Redact], which is stronger than url.URL.Redacted: it masks the
// password of every server of a list, a user name that stands alone (NATS
// reads it as a token), and the value of every query parameter whose name
// suggests a secret (password, token, secret, key, auth, cred), file
// parameters excepted. It masks a password whatever characters it holds:
// the user info is taken to end at the text's last '@', so an unescaped
// '/', '?', '#', ',' or '@' in a password does not let part of it pass for
// a path, a query or a server. Errors about a URL holding an '@' quote no
// part of it but the redacted whole, and an '@' past the server address
// is refused (escape it as %40). [Secret] and [Config] format as redacted
// text in fmt and log/slog.
package storeurl
