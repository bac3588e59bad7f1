package sqlbus_test

// The databases the tests run on, and a store with tables of its own per
// test, dropped when the test ends.

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"io"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
	"go.uber.org/goleak"
	_ "modernc.org/sqlite"

	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/sqlbus"
)

// TestMain silences the engine's and the relay's logs (the injected
// failures log each) unless SQLBUS_LOG is set, runs a child process
// when the test binary is started as one, and fails when a goroutine
// outlives the tests.
func TestMain(m *testing.M) {
	if os.Getenv("SQLBUS_LOG") == "" {
		slog.SetDefault(slog.New(slog.NewTextHandler(io.Discard, nil)))
	}
	if child() {
		return
	}
	goleak.VerifyTestMain(m)
}

var (
	postgresURL = testenv.Getenv("SQLBUS_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
	mysqlDSN    = testenv.Getenv("SQLBUS_MYSQL_DSN", "root@tcp(127.0.0.1:3306)/test")
)

const (
	startPostgres = "pg_ctlcluster 15 main start (Debian: apt-get install postgresql; the tests connect as postgres without a password to database test: createdb -U postgres test)"
	startMySQL    = "service mariadb start (Debian: apt-get install mariadb-server; the tests connect as root without a password to database test: mysql -uroot -e 'CREATE DATABASE test')"
)

// database is one database the tests run on.
type database struct {
	name    string
	dialect sqlbus.Dialect
	// dsn returns the driver name and the data source of the database for
	// t, after checking that its server answers.
	dsn func(t testing.TB) (driver, dsn string)
}

var databases = []database{
	{name: "postgres", dialect: sqlbus.Postgres, dsn: func(t testing.TB) (string, string) {
		u, err := url.Parse(postgresURL)
		if err != nil {
			t.Fatalf("SQLBUS_POSTGRES_URL: %v", err)
		}
		testenv.Require(t, "PostgreSQL", u.Host, startPostgres)
		return "pgx", postgresURL
	}},
	{name: "mysql", dialect: sqlbus.MySQL, dsn: func(t testing.TB) (string, string) {
		host := "127.0.0.1:3306"
		if i, j := strings.Index(mysqlDSN, "tcp("), strings.Index(mysqlDSN, ")/"); i >= 0 && j > i {
			host = mysqlDSN[i+4 : j]
		}
		testenv.Require(t, "MariaDB (or MySQL)", host, startMySQL)
		return "mysql", mysqlDSN
	}},
	{name: "sqlite", dialect: sqlbus.SQLite, dsn: func(t testing.TB) (string, string) {
		return "sqlite", sqliteDSN(filepath.Join(t.TempDir(), "sqlbus.db"))
	}},
}

// sqliteDSN is how SQLite should be opened for sqlbus: WAL (readers do
// not block the writer), a busy timeout (writers wait for each other),
// and transactions that take the write lock when they begin.
func sqliteDSN(path string) string {
	return "file:" + path + "?_pragma=busy_timeout(20000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_txlock=immediate"
}

// openDB opens db's database, closed when t ends.
func openDB(t testing.TB, db database) *sql.DB {
	t.Helper()
	drv, dsn := db.dsn(t)
	return openDSN(t, drv, dsn)
}

func openDSN(t testing.TB, drv, dsn string) *sql.DB {
	t.Helper()
	sdb, err := sql.Open(drv, dsn)
	if err != nil {
		t.Fatalf("open %s: %v", drv, err)
	}
	t.Cleanup(func() { _ = sdb.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := sdb.PingContext(ctx); err != nil {
		t.Fatalf("ping %s: %v", drv, err)
	}
	return sdb
}

// prefix returns a table prefix no other run uses.
func prefix() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return "t" + hex.EncodeToString(b[:]) + "_"
}

// newStore returns a store of db with tables of its own, dropped when t
// ends.
func newStore(t testing.TB, sdb *sql.DB, d sqlbus.Dialect) *sqlbus.SQLStore {
	t.Helper()
	p := prefix()
	dropTables(t, sdb, p)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := sqlbus.Open(ctx, sdb, d, sqlbus.Prefix(p))
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return st
}

// dropTables drops the tables of prefix p when t ends.
func dropTables(t testing.TB, sdb *sql.DB, p string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, table := range []string{"outbox", "outbox_lane", "inbox", "saga", "schema_version"} {
			if _, err := sdb.ExecContext(ctx, "DROP TABLE IF EXISTS "+p+table); err != nil {
				t.Errorf("cleanup: drop %s%s: %v", p, table, err)
			}
		}
	})
}
