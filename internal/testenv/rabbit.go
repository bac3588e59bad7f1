package testenv

import (
	"os/exec"
	"strings"
	"sync"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// DeleteRabbit removes the queues and exchanges whose names start with
// prefix from the RabbitMQ server at amqpURL. AMQP cannot list them:
// rabbitmqctl does.
func DeleteRabbit(t testing.TB, amqpURL, prefix string) {
	list := func(what string) []string {
		out, err := exec.Command("rabbitmqctl", "list_"+what, "-q", "--no-table-headers", "name").Output()
		if err != nil {
			t.Errorf("cleanup: rabbitmqctl list_%s: %v; delete what starts with %q by hand", what, err, prefix)
			return nil
		}
		var names []string
		for n := range strings.FieldsSeq(string(out)) {
			if strings.HasPrefix(n, prefix) {
				names = append(names, n)
			}
		}
		return names
	}
	var queues, exchanges []string
	var wg sync.WaitGroup // each rabbitmqctl boots a VM: seconds
	wg.Go(func() { queues = list("queues") })
	wg.Go(func() { exchanges = list("exchanges") })
	wg.Wait()
	ac, err := amqp.Dial(amqpURL)
	if err != nil {
		t.Logf("cleanup: dial: %v", err)
		return
	}
	defer ac.Close()
	ch, err := ac.Channel()
	if err != nil {
		t.Logf("cleanup: channel: %v", err)
		return
	}
	for _, q := range queues {
		if _, err := ch.QueueDelete(q, false, false, false); err != nil {
			t.Logf("cleanup: delete queue %s: %v", q, err)
			return
		}
	}
	for _, x := range exchanges {
		if err := ch.ExchangeDelete(x, false, false); err != nil {
			t.Logf("cleanup: delete exchange %s: %v", x, err)
			return
		}
	}
}
